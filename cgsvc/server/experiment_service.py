"""ExperimentService: a shell over cgsvc.domain.experiments (create, get, list, watch, cancel)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

from cgsvc import codec
from cgsvc.contract import EngineSettings
from cgsvc.domain.experiments import Experiments
from cgsvc.domain.labels import read_change
from cgsvc.ids import parse_name
from cgsvc.launch.store import Workload
from cgsvc.server.interceptors import RequestContext
from cgsvc.server.services import MESSAGE_BYTES, caller, list_page
from cgsvc.v1 import experiment_pb2


class ExperimentService:
    def __init__(self, experiments: Experiments, max_message_bytes: int = MESSAGE_BYTES) -> None:
        self.experiments = experiments
        self.max_message_bytes = max_message_bytes

    async def CreateExperiment(self, request: experiment_pb2.CreateExperimentRequest,  # noqa: N802 - gRPC name
                               rc: RequestContext) -> experiment_pb2.Experiment:
        wl = request.workload
        row = await self.experiments.create(
            list(request.plans), Workload(wl.input_len, wl.output_len, wl.requests, wl.concurrency, wl.seed),
            os.path.abspath(request.model_path) if request.model_path else "", request.repeats,
            request.dispatcher, caller(rc), EngineSettings.read(request.engine), request.rerun_of, request.request_id,
            dict(request.labels))
        return codec.experiment_proto(row)

    async def GetExperiment(self, request: experiment_pb2.GetExperimentRequest,  # noqa: N802
                            rc: RequestContext) -> experiment_pb2.Experiment:
        return codec.experiment_proto(await self.experiments.get(parse_name(request.name, "experiments")))

    async def ListExperiments(self, request: experiment_pb2.ListExperimentsRequest,  # noqa: N802
                              rc: RequestContext) -> experiment_pb2.ListExperimentsResponse:
        items, token = await list_page(self.experiments.store.list_rows, request, codec.experiment_proto,
                                       self.max_message_bytes)
        return experiment_pb2.ListExperimentsResponse(experiments=items, next_page_token=token)

    async def CancelExperiment(self, request: experiment_pb2.CancelExperimentRequest,  # noqa: N802
                               rc: RequestContext) -> experiment_pb2.Experiment:
        return codec.experiment_proto(await self.experiments.cancel(parse_name(request.name, "experiments"),
                                                                    caller(rc)))

    async def UpdateExperiment(self, request: experiment_pb2.UpdateExperimentRequest,  # noqa: N802
                               rc: RequestContext) -> experiment_pb2.Experiment:
        experiment_id = parse_name(request.experiment.name, "experiments", "experiment.name")
        change = read_change(request.experiment.labels, list(request.update_mask.paths), "experiment")
        return codec.experiment_proto(await self.experiments.relabel(experiment_id, change, caller(rc)))

    async def WatchExperiment(self, request: experiment_pb2.WatchExperimentRequest,  # noqa: N802
                              rc: RequestContext) -> AsyncIterator[experiment_pb2.Experiment]:
        async for row in self.experiments.watch(parse_name(request.name, "experiments")):
            yield codec.experiment_proto(row)
