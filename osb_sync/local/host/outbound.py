"""A sandbox's way out: slirp4netns, the firewall's tables in its network namespace, and, while
it has egress rules, its resolver (`egress.py`).

A container (`container.py`) holds one `Outbound` from its start; it has no way out until
`connect`, and none again after `disconnect` (slirp4netns's tap device, the namespace's only
way out, goes with it) or `close`. The container's lock serializes the calls.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
from collections.abc import Callable

from . import egress, firewall
from .identity import IdRange
from .slirp import start_slirp

logger = logging.getLogger("osb_sync.local")


class Outbound:
    """The way out of one sandbox's network namespace, and what guards it."""

    def __init__(self, report: Callable[[str], None]):
        self._report = report  # a line for the sandbox's events (a refused name or packet)
        self._slirp: subprocess.Popen[bytes] | None = None
        self._slirp_exit = -1
        self._wall: firewall.Wall | None = None  # its tables, once it had internet access
        self._resolver: egress.Resolver | None = None  # while it has rules (`egress.py`)
        self._names: firewall.Names | None = None  # the tables' kind while it has rules
        self.network = "none"  # "slirp4netns" from `connect` to `disconnect`

    @property
    def connected(self) -> bool:
        """Whether slirp4netns is attached (the sandbox has a way out)."""
        return self._slirp is not None

    def connect(
        self,
        tools: firewall.Tools | None,
        slirp: str,
        netns: int,
        ids: IdRange,
        deadline: float,
        rules: egress.Rules | None = None,
    ) -> None:
        """Load the firewall into the namespace `netns` (with `rules`, start the sandbox's
        resolver and load the policy's tables: `egress.py`), then attach slirp4netns.

        Raises:
            RuntimeError: the firewall's tools are missing or failed, or slirp4netns did not
                configure the network.
        """
        if tools is None:
            raise RuntimeError(firewall.INSTALL)
        joins = not ids.by_root  # not root: privileged in its user namespace only
        refused = firewall.tun_refusal(ids.own) if joins else None
        if refused is not None:
            raise RuntimeError(refused)
        if self._wall is None:
            self._wall = firewall.Wall(tools, netns, joins, ids.own)
        names = None
        if rules is not None:
            names = self._start_resolver(rules)
        try:
            self._wall.up(names)
            try:
                self._slirp, self._slirp_exit = start_slirp(slirp, netns, joins, deadline)
            except BaseException:
                with contextlib.suppress(RuntimeError):
                    self._wall.down()  # the next attempt makes the tap device again
                raise
        except BaseException:
            self._stop_resolver()
            raise
        self._names = names
        self.network = "slirp4netns"

    def change(self, rules: egress.Rules | None) -> None:
        """Another policy for a sandbox with a way out: the tables of its kind (loaded again,
        atomically, where the kind changes) and the resolver's rules."""
        assert self._wall is not None
        resolver = self._resolver
        if rules is None:
            if resolver is not None:
                self._wall.reload(None)
                self._stop_resolver()
            return
        if resolver is not None and self._names is not None:
            if self._names.restrict == (not rules.default_allow):
                resolver.set_rules(rules)
                return
            names = firewall.Names(
                self._names.udp, self._names.tcp, not rules.default_allow, firewall.new_mark()
            )
            resolver.set_rules(rules)
            self._wall.reload(names)
            self._names = names
            resolver.refill()
            return
        names = self._start_resolver(rules)
        try:
            self._wall.reload(names)
        except BaseException:
            self._stop_resolver()
            raise
        self._names = names

    def disconnect(self) -> None:
        """Take the way out away: slirp4netns stops, the sandbox keeps loopback only."""
        if self._slirp is None:
            return
        os.close(self._slirp_exit)
        self._slirp.kill()
        self._slirp.wait()
        self._slirp, self._slirp_exit = None, -1
        self.network = "none"
        self._stop_resolver()
        if self._wall is not None:
            self._wall.down()

    def close(self) -> None:
        """Stop slirp4netns and the resolver, and forget the tables (the namespace goes)."""
        if self._slirp_exit >= 0:
            os.close(self._slirp_exit)
            self._slirp_exit = -1
        if self._slirp is not None:
            self._slirp.kill()
            self._slirp.wait()
            self._slirp = None
        self._stop_resolver()
        if self._wall is not None:
            self._wall.forget()

    def _start_resolver(self, rules: egress.Rules) -> firewall.Names:
        """Start the sandbox's resolver on sockets in its namespace; the tables' kind for it."""
        assert self._wall is not None
        udp, tcp, log = self._wall.sockets()
        names = firewall.Names(
            udp.getsockname()[1], tcp.getsockname()[1], not rules.default_allow, firewall.new_mark()
        )
        self._resolver = egress.Resolver(
            rules,
            udp,
            tcp,
            self._wall.allow,
            self._wall.disallow,
            self._report,
            log=self._log_socket(log),
        )
        self._resolver.start()
        return names

    @staticmethod
    def _log_socket(log: socket.socket) -> socket.socket | None:
        try:
            firewall.listen_log(log, firewall.LOG_GROUP)
        except OSError as exc:  # refused packets go unreported; names still are
            logger.warning("local server: a sandbox's refused packets cannot be read: %s", exc)
            log.close()
            return None
        return log

    def _stop_resolver(self) -> None:
        if self._resolver is not None:
            self._resolver.stop()
            self._resolver = None
        self._names = None
