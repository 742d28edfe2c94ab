"""The job manager and the embedded cluster's control plane.

Runs in the control-plane process, never inside a training pod: it owns the rendezvous store of
every generation, turns agent reports and device health into faults, asks the policy what to do
and carries it out. :mod:`.job` is the loop; the parts it drives each own one piece of state
(:mod:`.generations`, :mod:`.incident`, :mod:`.engine`, :mod:`.pool`, :mod:`.executor`,
:mod:`.inprocess`, :mod:`.hotswitch`, :mod:`.scaling`, :mod:`.liveness`, :mod:`.milestones`).
``docs/recovery-route.md`` follows one recovery through them, hop by hop.
"""
