"""The domain layer: what the services do, with no gRPC in sight.

    plans.py      resolve a spec and record the plan in the audit log (PlanService and
                  LaunchService both come here)
    launches.py   the launch lifecycle: admission, devices, dispatch, events, reports,
                  cancellation, recovery

Services (cgsvc/server) call down into it; it calls down into the stores (cgsvc/audit,
cgsvc/launch/store.py) and the dispatchers; nothing here calls back up.
"""
