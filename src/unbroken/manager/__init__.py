"""The job manager and the embedded cluster's control plane (:mod:`.job`, :mod:`.executor`).

Runs in the control-plane process, never inside a training pod: it owns the rendezvous store of
every generation, turns agent reports and device health into faults, asks the policy what to do
and carries it out.
"""
