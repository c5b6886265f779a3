"""The stream-sum cluster on network-namespace hosts, every process started by the node script.

Five hosts of a `gazette.testing.netns.Net`: etcd members on h0-h2, a broker on every host,
summers on h1-h3, the S3 stand-in on h4 (so a fault aimed at a summer or at the etcd leader
never takes the store with it). Each process is ``vagrant/provision/gazette-node ROLE`` run
on its host with the node contract's variables (docs/cluster.md), exactly as systemd runs it
on the Vagrant machines: this module computes no command line of its own.

`NodeCluster` keeps one process per (host, role) and plays the supervisor: `supervise`
starts again whatever exited (a broker that found its lease gone exits, as upstream's do),
except roles a fault holds down. `converged` asks the brokers and summers (List RPCs) whether
every journal has a primary and its full replica set, and every shard a primary and its
standbys.

Given a `Secured`, the cluster runs with TLS and authorization on: each host's processes get
its certificate and the key through the node contract (`Secured.node_env`), and every client
of the harness presents the client certificate and signs with the key (`client_settings`,
`client_env`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
from secured import Secured

from gazette.broker.client import write_head
from gazette.broker.client.errors import BrokerError
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.client.list import list_all_journals
from gazette.broker.protocol import pb
from gazette.consumer.protocol import pb as cpb
from gazette.consumer.shard_client import ShardClient
from gazette.mainboilerplate.process import EXIT_LEASE_LOST
from gazette.testing.netns import Host, Net
from gazette.testing.s3 import MotoS3Server

ROOT = Path(__file__).resolve().parents[2]
NODE_SCRIPT = ROOT / "vagrant" / "provision" / "gazette-node"
EXAMPLES = ROOT / "examples"

ETCD_PORT = 2379
BROKER_PORT = 8080
CONSUMER_PORT = 8090
S3_PORT = 5000
BUCKET = "fragments"

BROKER_ROOT = "/gazette/cluster"
SUMMER_ROOT = "/gazette/consumers/stream-sum"
"""The etcd roots the node script gives brokers and summers (members under ``/members/``)."""
MEMBER_ROLES = {"broker": (BROKER_ROOT, "broker"), "summer": (SUMMER_ROOT, "stream-sum")}
"""Roles that hold a lease: their etcd root and the prefix of the suffix the node script
gives them (``PREFIX-NODE``)."""

ACK_JOURNAL = "cluster/acks"
ACK_SPEC = """\
name: {journal}
replication: 3
labels: [{{name: app, value: cluster-acks}}]
fragment:
  length: 262144
  compression_codec: NONE
  stores: ["s3://{bucket}/acks/?endpoint={s3}"]
  refresh_interval: 5s
"""


@dataclass(frozen=True)
class Layout:
    """Which host (by index) runs what."""

    hosts: int = 5
    etcd: tuple[int, ...] = (0, 1, 2)
    summers: tuple[int, ...] = (1, 2, 3)
    s3: int = 4


@dataclass(frozen=True)
class Settings:
    lease_ttl: int = 6
    partitions: int = 4
    replication: int = 3
    hot_standbys: int = 1


class ClusterError(RuntimeError):
    """A process did not start, a one-shot failed, or the cluster did not converge."""


@dataclass(frozen=True)
class Suspect:
    """A lease-holding process a fault may turn into a zombie (paused or cut off past its
    lease TTL), as it was when the fault was injected."""

    host: str
    role: str
    proc: subprocess.Popen[bytes]
    key: str
    """Its member key in etcd."""
    lease: int | None
    """The lease its key carried (None: not read)."""

    @property
    def name(self) -> str:
        return f"{self.role}@{self.host}"


class NodeCluster:
    """The processes of the cluster on `net`'s hosts (module docs)."""

    def __init__(
        self, net: Net, layout: Layout, settings: Settings, secured: Secured | None = None
    ) -> None:
        if len(net.hosts) != layout.hosts:
            raise ValueError(f"layout of {layout.hosts} hosts for a Net of {len(net.hosts)}")
        self.net = net
        self.secured = secured
        self.layout = layout
        self.settings = settings
        self.etcd_hosts = [net.hosts[i] for i in layout.etcd]
        self.summer_hosts = [net.hosts[i] for i in layout.summers]
        self.s3_host = net.hosts[layout.s3]
        self.broker_hosts = list(net.hosts)
        self.s3 = f"http://{self.s3_host.address}:{S3_PORT}"
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.held: set[tuple[str, str]] = set()
        """Roles a fault stopped on purpose: `supervise` leaves them down."""
        self.restarts = 0
        self._last_output = ""

    # -- the node contract

    def env(self, host: Host, *, etcd_state: str = "new") -> dict[str, str]:
        """The node contract's variables for `host`."""
        venv_bin = str(Path(sys.executable).parent)
        return {
            **MotoS3Server.env(),
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "GAZETTE_NODE": host.name,
            "GAZETTE_IP": host.address,
            "GAZETTE_ZONE": f"zone-{host.name}",
            "GAZETTE_DATA": str(host.directory / "data"),
            "GAZETTE_ETCD_MEMBERS": ",".join(f"{h.name}={h.address}" for h in self.etcd_hosts),
            "GAZETTE_ETCD_TOKEN": self.net.tag,
            "GAZETTE_ETCD_STATE": etcd_state,
            "GAZETTE_BROKERS": self.brokers_arg(),
            "GAZETTE_S3": self.s3,
            "GAZETTE_S3_BUCKET": BUCKET,
            "GAZETTE_LEASE_TTL": str(self.settings.lease_ttl),
            "GAZETTE_PYTHON": sys.executable,
            "GAZETTE_EXAMPLES": str(EXAMPLES),
            "GAZETTE_PARTITIONS": str(self.settings.partitions),
            "GAZETTE_REPLICATION": str(self.settings.replication),
            "GAZETTE_HOT_STANDBYS": str(self.settings.hot_standbys),
            **(self.secured.node_env(host.name) if self.secured else {}),
        }

    # -- the harness's clients

    def client_env(self) -> dict[str, str]:
        """The variables that make a client process (upstream's ``BROKER_*`` and
        ``CONSUMER_*``) use the cluster's TLS and keys; none when it is not secured."""
        return self.secured.client_env() if self.secured else {}

    def journal_client(self, endpoints: str | Sequence[str]) -> JournalClient:
        if self.secured is None:
            return JournalClient(endpoints)
        s = self.secured.settings()
        return JournalClient(endpoints, tls=s.tls(), auth=s.authorizer())

    def shard_client(self, endpoint: str) -> ShardClient:
        if self.secured is None:
            return ShardClient(endpoint)
        s = self.secured.settings()
        return ShardClient(endpoint, tls=s.tls(), auth=s.authorizer())

    def _etcd_url(self, host: Host, path: str) -> str:
        scheme = "https" if self.secured else "http"
        return f"{scheme}://{host.address}:{ETCD_PORT}{path}"

    def _etcd_context(self) -> ssl.SSLContext | None:
        return self.secured.ssl_context() if self.secured else None

    def brokers_arg(self, *, live_first: bool = False) -> str:
        """Every broker endpoint, comma separated; with `live_first`, brokers running and not
        isolated first (a client that starts now lists journals through the first)."""
        hosts = list(self.broker_hosts)
        if live_first:
            live = self.live("broker", hosts)
            hosts = live + [h for h in hosts if h not in live]
        return ",".join(f"{h.address}:{BROKER_PORT}" for h in hosts)

    def log(self, host: Host, role: str) -> Path:
        return host.directory / f"{role}.log"

    def tail(self, host: Host, role: str, n: int = 2000) -> str:
        try:
            return self.log(host, role).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    # -- processes

    def start(self, host: Host, role: str, *, etcd_state: str = "new") -> None:
        """Start `role` on `host` (replacing an exited process of it)."""
        proc = host.popen(
            [str(NODE_SCRIPT), role],
            env=self.env(host, etcd_state=etcd_state),
            log=self.log(host, role),
        )
        self.procs[(host.name, role)] = proc
        self.held.discard((host.name, role))

    def running(self, host: Host, role: str) -> bool:
        proc = self.procs.get((host.name, role))
        return proc is not None and proc.poll() is None

    def signal(self, host: Host, role: str, sig: signal.Signals) -> None:
        """Send `sig` to the role's process group (the node script execs the program in the
        session `Host.popen` made)."""
        proc = self.procs.get((host.name, role))
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def crash(self, host: Host, role: str) -> None:
        """SIGKILL the role on `host` and keep it down until `release`."""
        self.held.add((host.name, role))
        self.signal(host, role, signal.SIGKILL)
        self.procs[(host.name, role)].wait()

    def stop(self, pairs: Iterable[tuple[Host, str]], timeout: float = 60.0) -> None:
        """SIGTERM the roles (all at once), wait for them to exit, and keep them down until
        `release`. Raises ClusterError if one outlives `timeout` (it is then killed)."""
        pairs = list(pairs)
        for host, role in pairs:
            self.held.add((host.name, role))
            self.signal(host, role, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        slow = []
        for host, role in pairs:
            proc = self.procs[(host.name, role)]
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slow.append(f"{role}@{host.name}")
                self.signal(host, role, signal.SIGKILL)
                proc.wait()
        if slow:
            raise ClusterError(f"not stopped within {timeout:.0f}s of SIGTERM: {', '.join(slow)}")

    def release(self, pairs: Iterable[tuple[Host, str]]) -> None:
        """Start the held roles again (etcd members on their existing data)."""
        for host, role in pairs:
            self.start(host, role, etcd_state="existing")

    def supervise(self) -> list[str]:
        """Start again every role that exited and is not held; returns them."""
        again = []
        for (name, role), proc in list(self.procs.items()):
            if proc.poll() is not None and (name, role) not in self.held:
                self.start(self.net[name], role, etcd_state="existing")
                self.restarts += 1
                again.append(f"{role}@{name}")
        return again

    def one_shot(self, host: Host, role: str, timeout: float = 120.0) -> None:
        """Run a one-shot role (apply-journals, apply-shards) on `host` to completion."""
        rc = self._node(host, role, timeout=timeout)
        if rc != 0:
            raise ClusterError(f"{role} on {host.name}: rc {rc}\n{self._last_output}")

    # -- bringing it up

    def up(self, timeout: float = 120.0) -> None:
        """Start S3, etcd and the brokers, apply the journals (the one-shot makes the bucket),
        start the summers, apply the shards and the acknowledged journal, and wait until
        the cluster converged."""
        t0 = time.monotonic()
        self.start(self.s3_host, "s3")
        self.wait_ready([self.s3_host], "s3", timeout)
        for h in self.etcd_hosts:
            self.start(h, "etcd")
        self.wait_ready(self.etcd_hosts, "etcd", timeout)
        for h in self.broker_hosts:
            self.start(h, "broker")
        self.wait_ready(self.broker_hosts, "broker", timeout)
        self.one_shot(self.etcd_hosts[0], "apply-journals")
        self.apply_ack_journal()
        for h in self.summer_hosts:
            self.start(h, "summer")
        self.wait_ready(self.summer_hosts, "summer", timeout)
        self.one_shot(self.summer_hosts[0], "apply-shards")
        self.wait_converged(max(1.0, timeout - (time.monotonic() - t0)))

    def wait_ready(self, hosts: Sequence[Host], role: str, timeout: float) -> None:
        """Wait until `role` answers on each of `hosts` (the node script's own probe, run on
        the host). Raises ClusterError with the role's log if it does not."""
        for h in hosts:
            if self._node(h, role, "--wait", str(int(timeout)), timeout=timeout + 10) != 0:
                why = "exited" if not self.running(h, role) else "not ready in time"
                raise ClusterError(f"{role} on {h.name} {why}:\n{self.tail(h, role)}")

    def _node(self, host: Host, *args: str, timeout: float) -> int:
        env = [f"{k}={v}" for k, v in self.env(host).items()]
        r = host.run(["env", *env, str(NODE_SCRIPT), *args], timeout=timeout)
        self._last_output = r.stdout + r.stderr
        return r.returncode

    def apply_ack_journal(self) -> None:
        spec = ACK_SPEC.format(journal=ACK_JOURNAL, bucket=BUCKET, s3=self.s3)
        tls = self.secured.gazctl_flags() if self.secured else []
        r = subprocess.run(
            [sys.executable, "-m", "gazette.gazctl.main", "journals", "apply",
             "--broker", f"{self.broker_hosts[0].address}:{BROKER_PORT}", "--specs", "-", *tls],
            input=spec.encode(),
            env={**os.environ, **self.client_env()},
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        if r.returncode != 0:
            raise ClusterError(f"applying {ACK_JOURNAL}: {r.stderr.decode(errors='replace')}")

    # -- state

    def etcd_status(self, host: Host) -> tuple[int, int] | None:
        """(member id, leader id) as `host`'s member reports them; None if it does not
        answer."""
        req = urllib.request.Request(self._etcd_url(host, "/v3/maintenance/status"), data=b"{}")
        try:
            with urllib.request.urlopen(req, timeout=1, context=self._etcd_context()) as resp:
                st = json.loads(resp.read())
        except (OSError, ValueError):
            return None
        return int(st["header"]["member_id"]), int(st.get("leader", 0))

    def _etcd_range(self, request: dict[str, object]) -> dict[str, object] | None:
        """A Range through etcd's JSON gateway, answered by the first member that does
        (keys base64-encoded as the gateway wants them); None if none does."""
        body = json.dumps(
            {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v
             for k, v in request.items()}
        ).encode()  # fmt: skip
        for h in self.etcd_hosts:
            if h.name in self.net._isolated:
                continue
            req = urllib.request.Request(self._etcd_url(h, "/v3/kv/range"), body)
            try:
                with urllib.request.urlopen(req, timeout=2, context=self._etcd_context()) as resp:
                    answer = json.loads(resp.read())
            except (OSError, ValueError):
                continue
            if isinstance(answer, dict):
                return answer
        return None

    def member_count(self, root: str) -> int | None:
        """How many members (processes holding a lease) are announced under `root`, as the
        first etcd member that answers counts them; None if none does."""
        prefix = f"{root}/members/".encode()
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        answer = self._etcd_range({"key": prefix, "range_end": end, "count_only": True})
        return None if answer is None else int(str(answer.get("count", 0)))

    def member_key(self, host: Host, role: str) -> str:
        root, prefix = MEMBER_ROLES[role]
        return f"{root}/members/{self.env(host)['GAZETTE_ZONE']}#{prefix}-{host.name}"

    def member_lease(self, key: str) -> int | None:
        """The lease `key` carries (0: the key is absent); None if no etcd member answered."""
        answer = self._etcd_range({"key": key.encode()})
        if answer is None:
            return None
        kvs = answer.get("kvs") or []
        assert isinstance(kvs, list)
        return int(kvs[0].get("lease", 0)) if kvs else 0

    def suspects(self, host: Host) -> list[Suspect]:
        """The lease-holding processes running on `host`, with their leases as of now."""
        out = []
        for role in MEMBER_ROLES:
            proc = self.procs.get((host.name, role))
            if proc is not None and proc.poll() is None:
                key = self.member_key(host, role)
                out.append(Suspect(host.name, role, proc, key, self.member_lease(key)))
        return out

    def fenced(self, suspect: Suspect) -> tuple[bool, str]:
        """Whether `suspect` was fenced after its fault, and how it shows: it exited with the
        lease-lost status, or it exited otherwise and its member key now carries a lease
        other than the one it held (its own ended; its restarted process announced itself
        anew). A process still running was not fenced: its lease outlived the fault. Call it
        after convergence, which a zombie still running would have held up."""
        rc = suspect.proc.poll()
        if rc == EXIT_LEASE_LOST:
            return True, f"{suspect.name} exited {rc} (lease lost)"
        if rc is None:
            return False, f"{suspect.name} still runs: its lease {suspect.lease} outlived the fault"
        now = self.member_lease(suspect.key)
        fenced = bool(suspect.lease and now and now != suspect.lease)
        return fenced, f"{suspect.name} exited {rc}; its key's lease was {suspect.lease}, is {now}"

    def etcd_leader(self) -> Host | None:
        """The host of the member the answering members agree leads, if they do."""
        ids: dict[int, Host] = {}
        leaders = set()
        for h in self.etcd_hosts:
            st = self.etcd_status(h)
            if st is not None:
                ids[st[0]] = h
                leaders.add(st[1])
        if len(leaders) == 1:
            return ids.get(leaders.pop())
        return None

    def host_of(self, endpoint: str) -> Host:
        """The host whose address an advertised endpoint (``http://ip:port``) names."""
        ip = endpoint.split("://", 1)[-1].rsplit(":", 1)[0]
        for h in self.net.hosts:
            if h.address == ip:
                return h
        raise KeyError(endpoint)

    def live(self, role: str, hosts: Sequence[Host]) -> list[Host]:
        return [h for h in hosts if self.running(h, role) and h.name not in self.net._isolated]

    async def journals(self) -> list[pb.ListResponse.Journal]:
        """Every journal, as the first live broker that answers lists them ([]: none did)."""
        for h in self.live("broker", self.broker_hosts):
            try:
                async with self.journal_client(f"{h.address}:{BROKER_PORT}") as client:
                    return list(await asyncio.wait_for(list_all_journals(client, None), 5))
            except (grpc.aio.AioRpcError, TimeoutError, BrokerError):
                continue
        return []

    async def shards(self) -> list[cpb.ListResponse.Shard]:
        for h in self.live("summer", self.summer_hosts):
            try:
                async with self.shard_client(f"{h.address}:{CONSUMER_PORT}") as sc:
                    resp = await sc.stub.List(cpb.ListRequest(), timeout=5)
                    return list(resp.shards)
            except (grpc.aio.AioRpcError, TimeoutError):
                continue
        return []

    async def progress(self) -> list[str]:
        """Lines saying how far each shard's primary has read its sources (Stat) against the
        sources' write heads, and each replica's status: what a stalled shard looks like."""
        lines: list[str] = []
        heads: dict[str, int] = {}
        brokers = self.brokers_arg(live_first=True).split(",")
        async with self.journal_client(brokers) as client:
            for s in await self.shards():
                codes = [cpb.ReplicaStatus.Code.Name(st.code) for st in s.status]
                errors = [e for st in s.status for e in st.errors]
                line = f"shard {s.spec.id}: {codes}"
                if errors:
                    line += f" errors={errors}"
                primary = next(
                    (i for i, st in enumerate(s.status) if st.code == cpb.ReplicaStatus.PRIMARY),
                    None,
                )
                if primary is not None and primary < len(s.route.endpoints):
                    try:
                        async with self.shard_client(s.route.endpoints[primary]) as sc:
                            req = cpb.StatRequest(shard=s.spec.id)
                            resp = await sc.stub.Stat(req, timeout=5)
                        for journal, offset in sorted(resp.read_through.items()):
                            if journal not in heads:
                                heads[journal] = await asyncio.wait_for(
                                    write_head(client, journal), 5
                                )
                            line += f" | {journal} read {offset} of {heads[journal]}"
                    except (grpc.aio.AioRpcError, TimeoutError, BrokerError) as err:
                        line += f" | Stat failed: {err}"
                lines.append(line)
            for j in await self.journals():
                if j.spec.name.endswith("/sums"):
                    members = [f"{m.zone}#{m.suffix}" for m in j.route.members]
                    head = await asyncio.wait_for(write_head(client, j.spec.name), 5)
                    lines.append(
                        f"journal {j.spec.name}: write head {head}, primary {j.route.primary} "
                        f"of {members}"
                    )
        return lines

    def route_hosts(self, journal: str) -> list[Host]:
        """The hosts of `journal`'s route, its primary first ([] if it has no primary)."""
        for j in asyncio.run(self.journals()):
            if j.spec.name == journal and j.route.primary >= 0:
                r = j.route
                order = [r.primary, *(i for i in range(len(r.members)) if i != r.primary)]
                return [self.host_of(r.endpoints[i]) for i in order]
        return []

    def shard_primary_hosts(self) -> list[Host]:
        """Hosts of shard primaries, the host with most first."""
        counts: dict[str, int] = {}
        for s in asyncio.run(self.shards()):
            for i, st in enumerate(s.status):
                if st.code == cpb.ReplicaStatus.PRIMARY and i < len(s.route.endpoints):
                    h = self.host_of(s.route.endpoints[i])
                    counts[h.name] = counts.get(h.name, 0) + 1
        return [self.net[n] for n in sorted(counts, key=lambda n: -counts[n])]

    async def unconverged(self) -> list[str]:
        """What keeps the cluster from having converged ([]: converged): every process
        runs and holds its lease (a zombie, whose lease ended while it was cut off or
        paused, is not counted until it exits and is restarted), every journal has a
        primary and its full replica set, every shard a primary and its standbys."""
        problems = []
        down = [f"{r}@{n}" for (n, r), p in self.procs.items() if p.poll() is not None]
        if down:
            problems.append(f"down: {', '.join(sorted(down))}")
        for role, root, hosts in (
            ("broker", BROKER_ROOT, self.broker_hosts),
            ("summer", SUMMER_ROOT, self.summer_hosts),
        ):
            n = self.member_count(root)
            if n != len(hosts):
                problems.append(f"{n}/{len(hosts)} {role}s hold a lease")
        journals = await self.journals()
        if not journals:
            return ["no journals listed"]
        for j in journals:
            r = j.route
            if r.primary < 0 or len(r.members) != j.spec.replication:
                problems.append(
                    f"journal {j.spec.name}: {len(r.members)}/{j.spec.replication} brokers, "
                    f"primary {r.primary}"
                )
        shards = await self.shards()
        if len(shards) != self.settings.partitions:
            problems.append(f"{len(shards)}/{self.settings.partitions} shards listed")
        for s in shards:
            codes = sorted(st.code for st in s.status)
            want = sorted(
                [cpb.ReplicaStatus.PRIMARY] + [cpb.ReplicaStatus.STANDBY] * s.spec.hot_standbys
            )
            if codes != want:
                names = [cpb.ReplicaStatus.Code.Name(c) for c in codes]
                problems.append(f"shard {s.spec.id}: {names}")
        return problems

    def wait_converged(self, timeout: float) -> float:
        """Supervise until the cluster converged; seconds it took. Raises ClusterError with
        what was still wrong after `timeout`."""
        t0 = time.monotonic()
        problems: list[str] = []
        while time.monotonic() - t0 < timeout:
            self.supervise()
            problems = asyncio.run(self.unconverged())
            if not problems:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise ClusterError(f"not converged within {timeout:.0f}s: {'; '.join(problems[:6])}")
