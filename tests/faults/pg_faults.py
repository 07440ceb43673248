"""The fault suite on a PostgreSQL primary and its streaming standby (the ``pg_failover``
scenarios): the servers (tests/servers/pg_standby.py), the workers' way to them, and the
failover fault.

Each worker's ``store`` alias names both servers with ``target_session_attrs=read-write``, so
that the ``DatabaseStore`` and its ``LISTEN`` session follow whichever accepts writes; the fenced
counters stay in the suite's own PostgreSQL cluster (``default``), which no fault touches.

**The fault** (every ~10 s, tests/faults/replication.py): the standby's replication link goes
silent for 1 to 3 s (it runs through a proxy route of the run's own, hung), then the primary is
SIGKILLed (half the time a holder with it), the standby promoted at once with ``pg_ctl promote``
(the nemesis is the failover manager), and the killed server started again, empty, as a
``pg_basebackup`` standby of the new primary, through a new route. Under ``pg_failover``
replication is synchronous: a commit waits for the standby's flush, so what the silent link held
back was never answered, and the promoted standby has every lease a holder counts on. Under
``pg_failover_async`` it is asynchronous: what the primary answered while the link was silent is
not on the new primary, as on Redis.

**The ttl is 6 s**, as through a Sentinel failover (tests/faults/redis_faults.py): a lease must
outlive the silence and the promotion for the failover to cost anything but the lease itself.
"""

from __future__ import annotations

from typing import Any

from tests.faults.replication import ReplicationFaults
from tests.servers.pg_standby import StandbyPair

STANDBY_TTL = 6.0
STANDBY_SCENARIOS: dict[str, str] = {
    "pg_failover": "PostgreSQL with a synchronous standby: its link silent 1-3 s, the primary "
    "SIGKILLed, the standby promoted (pg_ctl promote), the old primary back as its standby",
    "pg_failover_async": "the same with asynchronous replication",
}


class StandbyFaults(ReplicationFaults):
    """The standby scenarios' servers and fault, for ``harness.Run``."""

    pair: StandbyPair | None

    def start_pair(self) -> StandbyPair:
        link = self.replication_link()
        synchronous = self.config.scenario == "pg_failover"
        self.pair = StandbyPair(synchronous=synchronous, database="faults", link=link)
        return self.pair

    def pair_database(self) -> dict[str, Any]:
        """The workers' ``store`` alias: both servers, the one accepting writes chosen."""
        assert self.pair is not None
        return self.pair.database_settings()

    def fault_pg_failover(self) -> None:
        pair = self.pair
        assert pair is not None
        self.fail_over(pair.kill_primary, pair.promote, pair.rejoin)

    fault_pg_failover_async = fault_pg_failover
