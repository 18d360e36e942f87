from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LaunchSpec(_message.Message):
    __slots__ = ("model", "hardware", "parallelism", "features", "overrides")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    hardware: HardwareSpec
    parallelism: ParallelismSpec
    features: FeatureSpec
    overrides: OverrideSpec
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ..., hardware: _Optional[_Union[HardwareSpec, _Mapping]] = ..., parallelism: _Optional[_Union[ParallelismSpec, _Mapping]] = ..., features: _Optional[_Union[FeatureSpec, _Mapping]] = ..., overrides: _Optional[_Union[OverrideSpec, _Mapping]] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("name", "path", "quantization")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    quantization: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., quantization: _Optional[str] = ...) -> None: ...

class HardwareSpec(_message.Message):
    __slots__ = ("gpu", "gpu_count", "nodes", "gpu_memory_mib")
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    gpu_count: int
    nodes: int
    gpu_memory_mib: int
    def __init__(self, gpu: _Optional[str] = ..., gpu_count: _Optional[int] = ..., nodes: _Optional[int] = ..., gpu_memory_mib: _Optional[int] = ...) -> None: ...

class ParallelismSpec(_message.Message):
    __slots__ = ("tp", "pp", "dp", "enable_dp_attention", "ep", "attn_cp", "dcp")
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    ENABLE_DP_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    ATTN_CP_FIELD_NUMBER: _ClassVar[int]
    DCP_FIELD_NUMBER: _ClassVar[int]
    tp: int
    pp: int
    dp: int
    enable_dp_attention: bool
    ep: int
    attn_cp: int
    dcp: int
    def __init__(self, tp: _Optional[int] = ..., pp: _Optional[int] = ..., dp: _Optional[int] = ..., enable_dp_attention: _Optional[bool] = ..., ep: _Optional[int] = ..., attn_cp: _Optional[int] = ..., dcp: _Optional[int] = ...) -> None: ...

class FeatureSpec(_message.Message):
    __slots__ = ("speculative_algorithm", "lora", "disaggregation_mode", "kv_cache_dtype", "chunked_prefill_size", "max_running_requests", "max_total_tokens", "context_length", "enable_torch_compile", "enable_hierarchical_cache", "cpu_offload_gb", "enable_deterministic_inference", "moe_a2a_backend", "deepep_mode", "enable_two_batch_overlap", "enable_eplb", "enable_multimodal")
    SPECULATIVE_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATION_MODE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_PREFILL_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ENABLE_TORCH_COMPILE_FIELD_NUMBER: _ClassVar[int]
    ENABLE_HIERARCHICAL_CACHE_FIELD_NUMBER: _ClassVar[int]
    CPU_OFFLOAD_GB_FIELD_NUMBER: _ClassVar[int]
    ENABLE_DETERMINISTIC_INFERENCE_FIELD_NUMBER: _ClassVar[int]
    MOE_A2A_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEEPEP_MODE_FIELD_NUMBER: _ClassVar[int]
    ENABLE_TWO_BATCH_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    ENABLE_EPLB_FIELD_NUMBER: _ClassVar[int]
    ENABLE_MULTIMODAL_FIELD_NUMBER: _ClassVar[int]
    speculative_algorithm: str
    lora: bool
    disaggregation_mode: str
    kv_cache_dtype: str
    chunked_prefill_size: int
    max_running_requests: int
    max_total_tokens: int
    context_length: int
    enable_torch_compile: bool
    enable_hierarchical_cache: bool
    cpu_offload_gb: int
    enable_deterministic_inference: bool
    moe_a2a_backend: str
    deepep_mode: str
    enable_two_batch_overlap: bool
    enable_eplb: bool
    enable_multimodal: bool
    def __init__(self, speculative_algorithm: _Optional[str] = ..., lora: _Optional[bool] = ..., disaggregation_mode: _Optional[str] = ..., kv_cache_dtype: _Optional[str] = ..., chunked_prefill_size: _Optional[int] = ..., max_running_requests: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., context_length: _Optional[int] = ..., enable_torch_compile: _Optional[bool] = ..., enable_hierarchical_cache: _Optional[bool] = ..., cpu_offload_gb: _Optional[int] = ..., enable_deterministic_inference: _Optional[bool] = ..., moe_a2a_backend: _Optional[str] = ..., deepep_mode: _Optional[str] = ..., enable_two_batch_overlap: _Optional[bool] = ..., enable_eplb: _Optional[bool] = ..., enable_multimodal: _Optional[bool] = ...) -> None: ...

class OverrideSpec(_message.Message):
    __slots__ = ("attention_backend", "prefill_attention_backend", "decode_attention_backend", "disable_cuda_graph", "disable_cuda_graph_padding", "enforce_piecewise_cuda_graph", "cuda_graph")
    ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DECODE_ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DISABLE_CUDA_GRAPH_FIELD_NUMBER: _ClassVar[int]
    DISABLE_CUDA_GRAPH_PADDING_FIELD_NUMBER: _ClassVar[int]
    ENFORCE_PIECEWISE_CUDA_GRAPH_FIELD_NUMBER: _ClassVar[int]
    CUDA_GRAPH_FIELD_NUMBER: _ClassVar[int]
    attention_backend: str
    prefill_attention_backend: str
    decode_attention_backend: str
    disable_cuda_graph: bool
    disable_cuda_graph_padding: bool
    enforce_piecewise_cuda_graph: bool
    cuda_graph: CudaGraphOverrides
    def __init__(self, attention_backend: _Optional[str] = ..., prefill_attention_backend: _Optional[str] = ..., decode_attention_backend: _Optional[str] = ..., disable_cuda_graph: _Optional[bool] = ..., disable_cuda_graph_padding: _Optional[bool] = ..., enforce_piecewise_cuda_graph: _Optional[bool] = ..., cuda_graph: _Optional[_Union[CudaGraphOverrides, _Mapping]] = ...) -> None: ...

class CudaGraphOverrides(_message.Message):
    __slots__ = ("prefill", "decode")
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    prefill: PrefillGraphOverride
    decode: DecodeGraphOverride
    def __init__(self, prefill: _Optional[_Union[PrefillGraphOverride, _Mapping]] = ..., decode: _Optional[_Union[DecodeGraphOverride, _Mapping]] = ...) -> None: ...

class PrefillGraphOverride(_message.Message):
    __slots__ = ("backend", "max_num_tokens", "num_tokens")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    max_num_tokens: int
    num_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, backend: _Optional[str] = ..., max_num_tokens: _Optional[int] = ..., num_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DecodeGraphOverride(_message.Message):
    __slots__ = ("backend", "max_bs", "bs")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MAX_BS_FIELD_NUMBER: _ClassVar[int]
    BS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    max_bs: int
    bs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, backend: _Optional[str] = ..., max_bs: _Optional[int] = ..., bs: _Optional[_Iterable[int]] = ...) -> None: ...
