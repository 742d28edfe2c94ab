"""The seed's TaskD import paths, installed with Unbroken: a TaskD script runs unchanged.

The seed's setup for resumable training tells users to write, in a ``manager.py`` started from
the rank-0 pod and in the training script::

    from taskd.api import init_taskd_manager, start_taskd_manager
    from taskd.api.taskd_worker_api import init_taskd_worker, start_taskd_worker

Both work as written. This package holds no logic of its own: :mod:`taskd.api`,
:mod:`taskd.api.taskd_manager_api` and :mod:`taskd.api.taskd_worker_api` re-export the functions
of :mod:`unbroken.compat.taskd` (the very same objects; importing them from there works too),
which say what each call does under Unbroken. It ships inside the ``unbroken`` distribution:
there is no distribution named ``taskd``. The rest of TaskD's Python API (its agent and proxy,
``destroy_taskd_worker``) is not here: under Unbroken the node agent (``unbroken launch``) and
the job manager of ``unbroken run`` do that work.

The seed's other TaskD lines:

- ``sed -i '/import os/i import taskd.python.adaptor.patch' .../torch/distributed/run.py`` in a
  Dockerfile: keep it or drop it. :mod:`taskd.python.adaptor.patch` imports without touching
  torchrun (see there); under Unbroken the pods' launcher is ``unbroken launch`` (a job's
  ``torchrun`` line runs as ``unbroken launch``), which carries what TaskD's patch adds to
  torchrun.
- ``TASKD_SO_PATH="$(pip show taskd | awk ...)"`` and ``export LD_PRELOAD=$TASKD_SO_PATH:
  $LD_PRELOAD``: not needed, Unbroken has no ``libtaskd.so`` and ships none; delete the two
  lines, or keep them, they are harmless. ``unbroken run`` reads a pod's script for its
  launcher line and the seed's knobs, and ``LD_PRELOAD`` is neither: it reaches no process.
  Where a shell runs them, ``pip show taskd`` finds no distribution named ``taskd`` (it prints
  ``WARNING: Package(s) not found: taskd`` on stderr), so ``TASKD_SO_PATH`` is empty and
  ``LD_PRELOAD`` gains only an empty entry, which the dynamic loader skips without a word. A
  path written by hand (the seed's fallback: ``pip show``'s Location plus
  ``/taskd/python/cython_api/libs/libtaskd.so``) names a file that does not exist: every
  process started with it prints one line on stderr, ``ERROR: ld.so: object '...' from
  LD_PRELOAD cannot be preloaded (cannot open shared object file): ignored.``, and runs on, its
  exit status unchanged. The seed's error "the libtaskd.so has not been loaded" cannot occur.

Which rungs a script gets: one that uses only the TaskD API (``manager.py`` and the worker
snippet, with no ``session = unbroken.worker.init(...)`` and ``for step in session.steps(n)``)
has no Unbroken session, and ``start_taskd_worker()`` creates none: it only confirms the agent.
Its processes report no step, so the in-process rungs (``retry``, ``recover-in-place``,
``recover``; also ``elastic-training`` and ``dump``), which need the session's heartbeat steps
and a replica of the state, are unavailable to it; the run says so once, on the console and in
its ledger (a ``RungsUnavailable`` record naming the rungs the job configures), and decides as
if they were off. Its faults are recovered by restarting its processes: in-pod restart, pod-
and job-level rescheduling, which resume from the script's own checkpoint. A script that also
creates a session (see ``examples/train_mlp.py``) gets the whole ladder.
"""
