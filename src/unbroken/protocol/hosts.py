"""The host-join protocol between a host's agent (``unbroken launch --join``) and the control
plane on another host: the names of its calls and of its orders.

The agent calls :data:`JOIN` with its node (``node``, ``devices``, ``address``, ``pid``), then
follows the node's order stream (:data:`NODE_ORDERS`, with ``node`` and ``pid``) until the
control plane closes it. With :data:`NODE_POD` it says that a process it started for a pod
started (``node``, ``pod``, ``pid``) or exited (the same and ``code``).

An order on the stream is a JSON object with a ``kind``:

- :data:`START` (``pod``, ``argv``, ``env``, ``cwd``, ``log``): start the pod's agent process;
  an ``argv`` entry :data:`PYTHON` stands for the interpreter of the host's agent;
- :data:`SIGNAL` (``pid``, ``sig``): send signal ``sig`` to the process ``pid`` it started.

Standard library only.
"""

from __future__ import annotations

#: A host's agent registers its node, then follows its orders.
JOIN = "NodeJoin"
NODE_ORDERS = "NodeOrders"
#: A host's agent says a process it started for a pod started (with its pid) or exited.
NODE_POD = "NodePod"

#: The kinds of the orders on a node's stream.
START = "start"
SIGNAL = "signal"
#: In a start order's ``argv``: the Python interpreter of the host that starts it.
PYTHON = "{python}"
