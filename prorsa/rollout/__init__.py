"""What the live and simulated bodies share: no dask, no simulator, no clock of their own.

    context.py        the resolve step: a pipeline -> the frozen RunContext a run starts from
    router.py         which engine runs each leg of a turn, composed of the five below
    engine_pools.py   the router's books: its engines' roles, closures, turns in flight, slots
    stickiness.py     which engine holds each trajectory's context
    engine_choice.py  stay on the trajectory's engine or move: the overload and cost rules
    cost_rule.py      the cost rule's prices and each engine's prefill backlog and KV
    migration.py      relocate: a trajectory's context warmed elsewhere while its tool runs
    placement.py      what moving a turn off its trajectory's engine costs, priced by the cost model
    legs.py           a turn's engine legs as requests, and the TurnResult they add up to
    control_loop.py   observe -> policy.decide -> switch engines -> record, every control interval
    drivers.py        synchronous and asynchronous RL drivers: which trajectories run, and when
"""
