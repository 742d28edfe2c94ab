"""Helpers shared by the test modules, imported as ``tests.support.<module>``.

- :mod:`tests.support.cli_runs`: run the ``unbroken`` CLI as a user does and read back what a
  run left behind (ledger, status, final model digest, leftover processes);
- :mod:`tests.support.process_helpers`: read a process-level recovery back from a run's events;
- :mod:`tests.support.disks`: a small tmpfs mounted for one test;
- :mod:`tests.support.netns_hosts`: hosts as network namespaces on bridges, for multi-host runs;
- :mod:`tests.support.ranks`: start rank processes the way the node agent does (forked from one
  zygote per test process), their environment, their store, and polling;
- :mod:`tests.support.worker_ranks`: generations of ``examples/`` training ranks on gloo;
- :mod:`tests.support.recovery_job`: a job of recovery rank processes, playing agent and
  manager (heartbeats, mailboxes, rejoin commands);
- :mod:`tests.support.manager_job`: the job manager as one component, with scripted agents and
  a fake clock;
- :mod:`tests.support.hostile`: the protocol's messages mutated as a hostile or broken peer
  sends them (hypothesis), and a check that a decoded value is what its type says;
- :mod:`tests.support.flood`: idle connections held open to a server, as anyone on the host
  can open them.

The scripts that tests run as rank processes are not here: they stay next to their tests and
import nothing from the test tree. Test modules never import each other: what two of them
share lives here (``tests/unit/test_test_tree.py`` checks both rules).
"""
