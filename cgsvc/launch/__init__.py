"""Launch infrastructure: the dispatchers that start worker groups (dispatch.py), the local
device inventory (devices.py) and the launch store (store.py). The lifecycle is
cgsvc/domain/launches.py, the RPCs cgsvc/server/launch_service.py."""
