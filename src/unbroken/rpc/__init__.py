"""Control traffic between agents, the job manager and the CLI: gRPC carrying JSON objects.

Every call carries the run's secret in the ``x-unbroken-secret`` metadata entry; a call without
it, or with another, is refused with ``UNAUTHENTICATED``. Payloads are JSON objects (never
pickles), so nothing from the network is executed. Servers bind to 127.0.0.1 by default; a job
across hosts speaks mutual TLS (:mod:`unbroken.rpc.tls`). gRPC's own log says errors only
(``GRPC_VERBOSITY=ERROR`` unless set): a refused TLS handshake is the caller's one-line error,
not log lines on stderr.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# gRPC reads its verbosity when it is imported: the variable is set first.
from unbroken.rpc.channel import (
    ControlClient,
    ControlServer,
    RpcError,
    Unary,
    UnaryStream,
)

__all__ = ["ControlClient", "ControlServer", "RpcError", "Unary", "UnaryStream"]
