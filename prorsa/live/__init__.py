"""The live body: a rollout carried out as keyed Dask tasks on engine and tool workers, in wall time.
It mirrors prorsa/sim/ (the virtual-time body); both run the shared pieces in prorsa/rollout/.

    run.py             run_live: cluster up, engines up, drive the workload, sample, write, tear down
    runtime.py         DaskTurnRunner: a turn as its task group (turn -> prefill -> decode)
    tasks.py           the functions Dask runs on workers, one per leg of a turn
    controller.py      LiveController: the shared control loop, with role switches carried out on Dask
    interrupt.py       Ctrl-C and SIGTERM: the rollout stops, the cleanup runs to its end
    resume.py          `prorsa run --resume`: the stopped run's pipeline and journal
    training.py        the RL loop's live side: SFT warm-up, the learner and where its trainer lives
    remote_trainer.py  the Trainer as a Dask actor on a worker of its own
"""
