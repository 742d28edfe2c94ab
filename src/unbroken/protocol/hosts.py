"""The host-join protocol between a host's agent (``unbroken launch --join``) and the control
plane on another host: the names of its calls and of its orders.

The channel is mutual TLS (:mod:`unbroken.rpc.tls`), and each call speaks for the node whose
certificate its connection proved, never another. The agent calls :data:`JOIN` with its node
(``node``, ``devices``, ``address``, ``pid``), then follows the node's order stream
(:data:`NODE_ORDERS`, with ``node`` and ``pid``) until the control plane closes it. With
:data:`NODE_POD` it says that a process it started for a pod started (``node``, ``pod``,
``pid``) or exited (the same and ``code``); with :data:`NODE_DONE` it answers an order that
carries an ``id`` (``node``, ``id``, ``ok``, and ``count`` or ``error``).

An order on the stream is a JSON object with a ``kind``:

- :data:`START` (``pod``, ``argv``, ``env``, ``cwd``, ``log``): start the pod's agent process;
  an ``argv`` entry :data:`PYTHON` stands for the interpreter of the host's agent. ``env`` is
  the pod's planned environment and what its agent needs (:data:`AGENT_VARS`), never the run's
  secret: the host starts the process with its own environment as the base, its own
  credentials, and its own values of :data:`HOST_VARS`;
- :data:`SIGNAL` (``pid``, ``sig``): send signal ``sig`` to ``pid``, a process the host
  started or one of their descendants (a pod's agent or one of its ranks);
- :data:`KILL` (``pid``): SIGKILL the process ``pid`` the host started and its descendants;
- :data:`DOWN` (``id``): the node goes down: SIGKILL every process the host started for pods,
  their descendants and its warm spare; answered with ``count``;
- :data:`THROTTLE` (``id``, ``cpu``): hold the host's pods' processes to ``cpu`` of one CPU
  (``cpu`` null: free them again); answered with ``count``;
- :data:`LINK` (``id``, ``pid``, ``exclude_ports``, ``peer_pids``): reset the TCP links of the
  rank ``pid`` (its peers' processes ``peer_pids`` on this host, or, null, every link but those
  of ``exclude_ports``); answered with ``count``.

A pid in any message is a process (never 0 or negative: ``kill`` reads those as a group or
every process). Standard library only.
"""

from __future__ import annotations

#: A host's agent registers its node, then follows its orders.
JOIN = "NodeJoin"
NODE_ORDERS = "NodeOrders"
#: A host's agent says a process it started for a pod started (with its pid) or exited.
NODE_POD = "NodePod"
#: A host's agent answers an order that carries an ``id``.
NODE_DONE = "NodeDone"
#: Every call of a host's agent: each names the node it speaks for (``node``).
NODE_CALLS = (JOIN, NODE_ORDERS, NODE_POD, NODE_DONE)

#: The kinds of the orders on a node's stream.
START = "start"
SIGNAL = "signal"
KILL = "kill"
DOWN = "down"
THROTTLE = "throttle"
LINK = "link"
#: The orders that name a process (``pid``).
PID_ORDERS = (SIGNAL, KILL, LINK)
#: In a start order's ``argv``: the Python interpreter of the host that starts it.
PYTHON = "{python}"

#: The variables of a pod's agent a start order may carry besides the pod's planned
#: environment: what the control plane decides for the pod (the rest of ``UNBROKEN_*`` is the
#: host's, or never leaves the control plane's host).
AGENT_VARS = frozenset(
    {
        "UNBROKEN_POD",
        "UNBROKEN_NODE",
        "UNBROKEN_DEVICES",
        "UNBROKEN_RUN_DIR",
        "UNBROKEN_JOB_ID",
        "UNBROKEN_HANG_FLOOR_S",
        "UNBROKEN_HANG_FACTOR",
        "UNBROKEN_HANG_STARTUP_S",
        "UNBROKEN_DECISION_WAIT_S",
        "UNBROKEN_COMMAND_TIMEOUT_S",
        "UNBROKEN_CHAOS",
        "UNBROKEN_CHAOS_DIR",
        "UNBROKEN_START_PLANE",
    }
)
#: What only the host decides, whatever an order says: how its agent reaches the control plane
#: and with which credentials, and the basics of its processes (paths, the loader, the user).
HOST_VARS = frozenset(
    {
        "UNBROKEN_CONTROL",
        "UNBROKEN_SECRET",
        "UNBROKEN_CREDENTIALS",
        "UNBROKEN_SHARED_IMAGE",
        "UNBROKEN_STANDBY",
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
    }
)
#: Variable names with these prefixes are the host's too (the dynamic loader's).
HOST_PREFIXES = ("LD_",)


def host_decides(name: str) -> bool:
    """Whether the variable ``name`` is the host's alone (see :data:`HOST_VARS`)."""
    return name in HOST_VARS or name.startswith(HOST_PREFIXES)
