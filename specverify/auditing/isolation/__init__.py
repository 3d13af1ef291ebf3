"""How the audit calls a function it does not trust, so that no crash, hang or trick becomes a pass.

- ``guarded.py`` — every call of the function under audit (in a worker or in-process), its
  outputs validated against the layout and the law;
- ``process.py``, ``worker.py`` — the worker process: shared-memory transport, deadlines enforced
  by killing, restarts, the mapping of every abnormal end to a fault;
- ``spawn.py`` — starting a worker (the CLI starts the first one before it imports the audit);
- ``allocator.py`` — glibc's allocator keeping large freed blocks, in the worker and in the audit;
- ``faults.py`` — the kinds of fault and the in-process probes (deadline, input mutation, global RNG);
- ``presentation.py`` — how inputs reach the function: contiguous, or as strided views;
- ``write_guard.py`` — the worker's inputs read-only while the function runs (writes recorded);
- ``captured.py`` — third-party warnings kept out of the terminal and in the report.
"""
