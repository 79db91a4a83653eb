"""Free TCP ports: reserved by the kernel and held until launch (`PortReservation`,
`free_port`), and whether one is taken (`port_in_use`).

A port is free again from `release()` until the worker's server binds it (a few
seconds); another program binding it then fails that worker and the launch,
and a rerun picks new ports. TensorFlow's server cannot adopt a bound socket.
"""

from __future__ import annotations

import errno
import socket

from shardfeed._common import errors as _errors


class PortReservation:
    """Holds `count` kernel-chosen free ports on `host` until released.

    Args:
        count: Number of distinct ports to reserve.
        host: IPv4 address to bind, e.g. "127.0.0.1" for local workers or ""
            for every interface.

    Raises:
        ValueError: If `count` is not a positive integer.
        OSError: If the kernel cannot bind a socket.

    Example:
        >>> with PortReservation(2, "127.0.0.1") as reservation:
        ...     ports = reservation.ports
        ...     reservation.release()  # just before starting the workers
        ...     start_workers(ports)
    """

    def __init__(self, count: int, host: str = "127.0.0.1") -> None:
        if not isinstance(count, int) or count < 1:
            raise ValueError(
                _errors.message(
                    "The number of ports to reserve must be a positive integer.",
                    f"count={count!r}",
                    "Pass the number of workers.",
                )
            )
        self.host = host
        self._sockets: list[socket.socket] = []
        try:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self._sockets.append(sock)
                # No SO_REUSEADDR: it would let a second bind share a port we hold.
                sock.bind((host, 0))
        except BaseException:
            self.release()
            raise
        self.ports: tuple[int, ...] = tuple(s.getsockname()[1] for s in self._sockets)

    def release(self) -> None:
        """Closes the held sockets so the workers can bind the ports.

        Call it as late as possible: right before the workers start. Calling it
        twice is harmless.
        """
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def free_port(host: str = "127.0.0.1") -> int:
    """Returns one port that was free on `host` a moment ago.

    The socket is closed before returning, so the window described in the
    module docstring starts now; prefer `PortReservation` when you can hold
    the port until the consumer starts.

    Args:
        host: IPv4 address to bind ("" for every interface).

    Returns:
        The port number.

    Example:
        >>> port = free_port("127.0.0.1")
    """
    with PortReservation(1, host) as reservation:
        return reservation.ports[0]


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket holds `port` on `host` ("" for every interface).

    Binds the port with SO_REUSEADDR, as gRPC does, so that a closed
    connection's TIME_WAIT does not count; the port is free again when this
    returns. False also when the bind fails for another reason (e.g. no IPv4
    here): the runtime that binds it next reports that itself.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as err:
        return err.errno == errno.EADDRINUSE
    finally:
        probe.close()
    return False
