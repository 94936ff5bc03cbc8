"""What the live and simulated bodies share: no dask, no simulator, no clock of their own.

    context.py       the resolve step: a pipeline -> the frozen RunContext a run starts from
    router.py        which engine runs each leg of a turn
    placement.py     what moving a turn off its trajectory's engine costs, priced by the cost model
    legs.py          a turn's engine legs as requests, and the TurnResult they add up to
    control_loop.py  observe -> policy.decide -> switch engines -> record, every control interval
    drivers.py       synchronous and asynchronous RL drivers: which trajectories run, and when
"""
