"""The node provisioning (vagrant/): `gazette-node ROLE --print` gives each role's command
lines from the environment and names a missing variable; the systemd units verify and run
`gazette-node`; `install.sh` passes shellcheck and, run as root into a scratch root, lays
down a node whose `node.env` gives every role the command line the namespace cluster gives
it. Marked `cluster`: every role started through `gazette-node` on namespace hosts, the
specs applied by its one-shots, and a stream-sum load verified exactly once."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VAGRANT = REPO / "vagrant"
NODE = VAGRANT / "provision" / "gazette-node"
UNITS = VAGRANT / "provision" / "units"
INSTALL = VAGRANT / "provision" / "install.sh"

PY = "/opt/gazette/venv/bin/python"
ETCD = shutil.which("etcd") or "etcd"
MEMBERS = "http://10.42.0.11:2379,http://10.42.0.12:2379,http://10.42.0.13:2379"
ENV = {
    "GAZETTE_NODE": "node1",
    "GAZETTE_IP": "10.42.0.11",
    "GAZETTE_ZONE": "zone-a",
    "GAZETTE_DATA": "/data",
    "GAZETTE_ETCD_MEMBERS": "node1=10.42.0.11,node2=10.42.0.12,node3=10.42.0.13",
    "GAZETTE_BROKERS": "10.42.0.12:8080,10.42.0.11:8080",
    "GAZETTE_S3": "http://10.42.0.13:5000",
    "GAZETTE_PYTHON": PY,
    "GAZETTE_EXAMPLES": "/opt/gazette/examples",
}
STORE = "'s3://fragments/gazette/?endpoint=http://10.42.0.13:5000'"


def node(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run gazette-node with exactly `env` (and PATH): nothing of this process's leaks in."""
    return subprocess.run(
        [str(NODE), *argv],
        env={"PATH": os.environ["PATH"], **(ENV if env is None else env)},
        capture_output=True,
        text=True,
        timeout=30,
    )


def printed(role: str, **extra: str) -> list[str]:
    r = node(role, "--print", env={**ENV, **extra})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def consumer_line(app: str, application: str, port: int) -> str:
    return (
        f"PYTHONPATH=/opt/gazette/examples/{app} {PY} -m gazette.consumer.main {application} "
        f"--etcd {MEMBERS} --root /gazette/consumers/{app} "
        "--broker 10.42.0.12:8080,10.42.0.11:8080 --zone zone-a "
        f"--suffix {app}-node1 --listen 10.42.0.11:{port} --http-port {port + 1} "
        f"--workdir /data/{app} --lease-ttl 20 --drain-timeout 30"
    )


DAEMONS = {
    "etcd": [
        f"{ETCD} --name=node1 --data-dir=/data/etcd "
        "--listen-client-urls=http://10.42.0.11:2379 "
        "--advertise-client-urls=http://10.42.0.11:2379 "
        "--listen-peer-urls=http://10.42.0.11:2380 "
        "--initial-advertise-peer-urls=http://10.42.0.11:2380 "
        "--initial-cluster=node1=http://10.42.0.11:2380,node2=http://10.42.0.12:2380,"
        "node3=http://10.42.0.13:2380 --initial-cluster-state=new "
        "--initial-cluster-token=gazette --pre-vote --logger=zap --log-level=warn"
    ],
    "broker": [
        f"{PY} -m gazette.broker.main --etcd {MEMBERS} --root /gazette/cluster --zone zone-a "
        "--suffix broker-node1 --listen 10.42.0.11:8080 --http-port 8081 "
        "--spool-dir /data/broker --lease-ttl 20 --drain-timeout 30"
    ],
    "summer": [consumer_line("stream-sum", "stream_sum.app:Summer", 8090)],
    "word-count": [consumer_line("word-count", "word_count.app:WordCount", 8092)],
    "s3": [f"{PY} -m moto.server -H 10.42.0.11 -p 5000"],
}


@pytest.mark.parametrize("role", sorted(DAEMONS))
def test_print_gives_the_command_line_of_each_daemon(role: str) -> None:
    assert printed(role) == DAEMONS[role]


def test_print_follows_the_variables_given() -> None:
    [etcd] = printed(
        "etcd", GAZETTE_ETCD_STATE="existing", GAZETTE_ETCD_TOKEN="t2", GAZETTE_DATA="/d2"
    )
    assert "--initial-cluster-state=existing" in etcd and "--initial-cluster-token=t2" in etcd
    assert "--data-dir=/d2/etcd" in etcd
    [broker] = printed("broker", GAZETTE_LEASE_TTL="7", GAZETTE_DRAIN_TIMEOUT="0")
    assert broker.endswith("--lease-ttl 7 --drain-timeout 0")
    [summer] = printed("summer", PYTHONPATH="/x")
    assert summer.startswith("PYTHONPATH=/opt/gazette/examples/stream-sum:/x ")


def test_apply_journals_makes_the_bucket_then_applies_each_apps_journals() -> None:
    lines = printed("apply-journals", GAZETTE_APPS="stream-sum,word-count", GAZETTE_REPLICATION="2")
    assert len(lines) == 5
    bucket, ss_gen, ss_apply, wc_gen, wc_apply = lines
    assert bucket.startswith(f"{PY} -c ") and bucket.endswith(" http://10.42.0.13:5000 fragments")
    assert ss_gen == (
        f"PYTHONPATH=/opt/gazette/examples/stream-sum {PY} -m stream_sum.specs journals "
        f"--partitions 4 --replication 2 --store {STORE} > /data/specs/stream-sum-journals.yaml"
    )
    # The node's own broker when it is listed (here second), else the first listed.
    assert ss_apply == (
        f"{PY} -m gazette.gazctl.main journals apply --broker 10.42.0.11:8080 "
        "--specs /data/specs/stream-sum-journals.yaml"
    )
    assert wc_gen.startswith(f"PYTHONPATH=/opt/gazette/examples/word-count {PY} -c ")
    assert wc_gen.endswith(f" 4 {STORE} 2 > /data/specs/word-count-journals.yaml")
    assert wc_apply.endswith("--specs /data/specs/word-count-journals.yaml")
    elsewhere = printed("apply-journals", GAZETTE_IP="10.42.0.99", GAZETTE_S3_BUCKET="b")
    assert "--broker 10.42.0.12:8080 " in elsewhere[2]
    assert elsewhere[0].endswith(" b") and "s3://b/gazette/" in elsewhere[1]


def test_apply_shards_goes_through_the_nodes_own_consumers() -> None:
    assert printed("apply-shards", GAZETTE_PARTITIONS="8", GAZETTE_HOT_STANDBYS="0") == [
        f"PYTHONPATH=/opt/gazette/examples/stream-sum {PY} -m stream_sum.specs shards "
        "--partitions 8 --hot-standbys 0 > /data/specs/stream-sum-shards.yaml",
        f"{PY} -m gazette.gazctl.main shards apply --consumer 10.42.0.11:8090 "
        "--broker 10.42.0.11:8080 --specs /data/specs/stream-sum-shards.yaml",
    ]
    wc = printed("apply-shards", GAZETTE_APPS="word-count")
    assert wc[0].endswith(" 4 1 > /data/specs/word-count-shards.yaml")
    assert "--consumer 10.42.0.11:8092 " in wc[1]


@pytest.mark.parametrize(
    ("role", "unset", "set_to", "error"),
    [
        ("etcd", "GAZETTE_NODE", "", "etcd needs GAZETTE_NODE"),
        ("etcd", "GAZETTE_ETCD_MEMBERS", "", "etcd needs GAZETTE_ETCD_MEMBERS"),
        (
            "etcd",
            "GAZETTE_ETCD_MEMBERS",
            "node2=10.42.0.12",
            "GAZETTE_ETCD_MEMBERS does not list this node",
        ),
        (
            "etcd",
            "GAZETTE_ETCD_MEMBERS",
            "node1:10.42.0.11",
            "GAZETTE_ETCD_MEMBERS: 'node1:10.42.0.11' is not name=ip",
        ),
        ("broker", "GAZETTE_ZONE", "", "broker needs GAZETTE_ZONE"),
        ("broker", "GAZETTE_IP", "", "broker needs GAZETTE_IP"),
        ("broker", "GAZETTE_LEASE_TTL", "1", "GAZETTE_LEASE_TTL must be at least 2"),
        ("summer", "GAZETTE_EXAMPLES", "", "summer needs GAZETTE_EXAMPLES"),
        ("word-count", "GAZETTE_BROKERS", "", "word-count needs GAZETTE_BROKERS"),
        ("s3", "GAZETTE_IP", "", "s3 needs GAZETTE_IP"),
        ("apply-journals", "GAZETTE_S3", "", "apply-journals needs GAZETTE_S3"),
        ("apply-journals", "GAZETTE_APPS", "stream-sum,nope", "GAZETTE_APPS: unknown ['nope']"),
        ("apply-shards", "GAZETTE_PARTITIONS", "four", "GAZETTE_PARTITIONS must be an integer"),
    ],
)
def test_a_missing_or_bad_variable_is_named(role: str, unset: str, set_to: str, error: str) -> None:
    env = {k: v for k, v in ENV.items() if k != unset}
    if set_to:
        env[unset] = set_to
    for argv in ((role, "--print"), (role,)):
        r = node(*argv, env=env)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.startswith(f"gazette-node: {error}"), r.stderr


@pytest.mark.parametrize("argv", [(), ("nope",), ("broker", "--bogus"), ("apply-shards", "--wait")])
def test_usage(argv: tuple[str, ...]) -> None:
    r = node(*argv)
    assert r.returncode == 2 and r.stderr.startswith("usage: gazette-node {etcd,broker,"), r.stderr


# -- Secured: TLS and authorization from GAZETTE_TLS_* and GAZETTE_AUTH_KEYS

SECRET = "c2VjcmV0LWtleS1vZi10aGUtdGVzdA=="
SECURE = {
    "GAZETTE_TLS_CA": "/tls/ca.pem",
    "GAZETTE_TLS_CERT": "/tls/node.pem",
    "GAZETTE_TLS_KEY": "/tls/node-key.pem",
    "GAZETTE_AUTH_KEYS": SECRET,
}
HTTPS_MEMBERS = MEMBERS.replace("http://", "https://")
ETCD_CLIENT = "--etcd-cert-file /tls/node.pem --etcd-cert-key-file /tls/node-key.pem " \
    "--etcd-trusted-ca-file /tls/ca.pem"  # fmt: skip
SERVER = (
    "--server-cert-file /tls/node.pem --server-cert-key-file /tls/node-key.pem "
    "--server-ca-file /tls/ca.pem --peer-cert-file /tls/node.pem "
    "--peer-cert-key-file /tls/node-key.pem --peer-ca-file /tls/ca.pem"
)


def client_tls(prefix: str = "") -> str:
    return (
        f"--{prefix}cert-file /tls/node.pem --{prefix}cert-key-file /tls/node-key.pem "
        f"--{prefix}trusted-ca-file /tls/ca.pem"
    )


def secured(line: str, keys: str = "") -> str:
    """`line` of the plain cluster as the secured one prints it: https etcd endpoints, and
    `keys` (a program's keys variable) taking the node's keys, shown by name."""
    line = line.replace(MEMBERS, HTTPS_MEMBERS)
    return f'{keys}="$GAZETTE_AUTH_KEYS" {line}' if keys else line


SECURED_DAEMONS = {
    "etcd": [
        DAEMONS["etcd"][0].replace("-client-urls=http://", "-client-urls=https://")
        + " --cert-file=/tls/node.pem --key-file=/tls/node-key.pem --client-cert-auth "
        "--trusted-ca-file=/tls/ca.pem"
    ],
    "broker": [secured(DAEMONS["broker"][0], "BROKER_AUTH_KEYS") + f" {ETCD_CLIENT} {SERVER}"],
    "summer": [
        secured(DAEMONS["summer"][0]).replace(
            "PYTHONPATH=/opt/gazette/examples/stream-sum ",
            'PYTHONPATH=/opt/gazette/examples/stream-sum CONSUMER_AUTH_KEYS="$GAZETTE_AUTH_KEYS" ',
        )
        + f" {ETCD_CLIENT} {SERVER} {client_tls('broker-')}"
    ],
    "word-count": [
        secured(DAEMONS["word-count"][0]).replace(
            "PYTHONPATH=/opt/gazette/examples/word-count ",
            'PYTHONPATH=/opt/gazette/examples/word-count CONSUMER_AUTH_KEYS="$GAZETTE_AUTH_KEYS" ',
        )
        + f" {ETCD_CLIENT} {SERVER} {client_tls('broker-')}"
    ],
    # moto has no TLS: the S3 stand-in stays plain HTTP.
    "s3": DAEMONS["s3"],
}


@pytest.mark.parametrize("role", sorted(DAEMONS))
def test_secured_daemons_serve_tls_and_take_the_keys_from_the_environment(role: str) -> None:
    lines = printed(role, **SECURE)
    assert lines == SECURED_DAEMONS[role]
    assert SECRET not in "".join(lines)


def test_secured_one_shots_give_gazctl_the_certificate_and_the_keys() -> None:
    journals = printed("apply-journals", **SECURE)
    assert journals[2] == (
        f'BROKER_AUTH_KEYS="$GAZETTE_AUTH_KEYS" {PY} -m gazette.gazctl.main journals apply '
        "--broker 10.42.0.11:8080 --specs /data/specs/stream-sum-journals.yaml "
        f"{client_tls()}"
    )
    shards = printed("apply-shards", **SECURE)
    assert shards[1] == (
        'BROKER_AUTH_KEYS="$GAZETTE_AUTH_KEYS" CONSUMER_AUTH_KEYS="$GAZETTE_AUTH_KEYS" '
        f"{PY} -m gazette.gazctl.main shards apply --consumer 10.42.0.11:8090 "
        "--broker 10.42.0.11:8080 --specs /data/specs/stream-sum-shards.yaml "
        f"{client_tls()} {client_tls('consumer-')}"
    )
    # The spec generators and the bucket (moto, plain HTTP) are as without TLS.
    assert journals[:2] == printed("apply-journals")[:2]
    assert SECRET not in "".join(journals + shards)


def test_tls_alone_and_keys_alone() -> None:
    tls_only = {k: v for k, v in SECURE.items() if k != "GAZETTE_AUTH_KEYS"}
    [broker] = printed("broker", **tls_only)
    assert broker == SECURED_DAEMONS["broker"][0].removeprefix(
        'BROKER_AUTH_KEYS="$GAZETTE_AUTH_KEYS" '
    )
    [broker] = printed("broker", GAZETTE_AUTH_KEYS=SECRET)
    assert broker == f'BROKER_AUTH_KEYS="$GAZETTE_AUTH_KEYS" {DAEMONS["broker"][0]}'


@pytest.mark.parametrize("unset", ["GAZETTE_TLS_CA", "GAZETTE_TLS_CERT", "GAZETTE_TLS_KEY"])
def test_tls_files_go_together(unset: str) -> None:
    for role in ("etcd", "broker", "summer", "apply-journals", "apply-shards"):
        r = node(role, "--print", env={**ENV, **SECURE, unset: ""})
        assert r.returncode == 2 and r.stdout == ""
        assert f"GAZETTE_TLS_KEY go together: {unset} unset" in r.stderr, r.stderr


def test_wait_times_out_on_a_server_not_there() -> None:
    r = node("broker", "--wait", "1", env={**ENV, "GAZETTE_IP": "127.0.0.1"})
    assert r.returncode == 1 and "broker not ready after 1s" in r.stderr


# -- systemd units and the install script


def units() -> dict[str, configparser.ConfigParser]:
    out = {}
    for path in sorted(UNITS.glob("*.service")):
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read(path)
        out[path.stem.removeprefix("gazette-")] = parser
    return out


def test_every_daemon_role_has_a_unit_running_it_through_gazette_node() -> None:
    found = units()
    assert sorted(found) == sorted(DAEMONS)
    for role, unit in found.items():
        s = unit["Service"]
        assert s["EnvironmentFile"] == "/etc/gazette/node.env"
        assert s["ExecStart"] == f"/usr/local/bin/gazette-node {role}"
        assert s["Restart"] == "always" and s["KillSignal"] == "SIGTERM"
        assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # Retry for as long as it takes.
        assert unit["Install"]["WantedBy"] == "multi-user.target"
        if role != "etcd":  # Healthy only with a quorum: nothing waits for it (see the unit).
            wait = re.fullmatch(
                rf"/usr/local/bin/gazette-node {role} --wait (\d+)", s["ExecStartPost"]
            )
            assert wait and int(wait[1]) < int(s["TimeoutStartSec"])


def test_stops_drain_before_systemd_kills() -> None:
    drain = int(re.search(r"--drain-timeout (\d+)", DAEMONS["broker"][0])[1])  # type: ignore[index]
    for role, unit in units().items():
        if role in ("broker", "summer", "word-count"):
            assert int(unit["Service"]["TimeoutStopSec"]) > drain + 10, role
        if role in ("summer", "word-count"):
            assert "gazette-broker.service" in unit["Unit"]["After"].split()
            assert "gazette-broker.service" in unit["Unit"]["Wants"].split()


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # The installed paths pointed at the repository's script and a scratch environment file.
    env_file = tmp_path / "node.env"
    env_file.write_text("".join(f'{k}="{v}"\n' for k, v in ENV.items()))
    for unit in UNITS.glob("*.service"):
        text = unit.read_text().replace("/usr/local/bin/gazette-node", str(NODE))
        (tmp_path / unit.name).write_text(text.replace("/etc/gazette/node.env", str(env_file)))
    r = subprocess.run(
        ["systemd-analyze", "verify", *map(str, sorted(tmp_path.glob("*.service")))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "ignoring" not in r.stderr, r.stderr


def test_install_script_parses() -> None:
    r = subprocess.run(["bash", "-n", str(INSTALL)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_install_script_passes_shellcheck() -> None:
    r = subprocess.run(["shellcheck", str(INSTALL)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


INSTALLED_PYTHON = "/opt/gazette/venv/bin/python"
INSTALLED_EXAMPLES = "/opt/gazette/examples"
ROLES = [*DAEMONS, "apply-journals", "apply-shards"]


def environment_file(text: str) -> dict[str, str]:
    """The variables of an EnvironmentFile as systemd reads them, for the form install.sh
    writes: comments and blank lines skipped, ``KEY="value"`` with the quotes removed. A
    line outside that form (where systemd's reading would need its escapes and
    continuations) fails the test."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        m = re.fullmatch(r'([A-Za-z_][A-Za-z0-9_]*)="([^"\\]*)"', line)
        assert m, f'not a plain KEY="value" line: {line!r}'
        out[m[1]] = m[2]
    return out


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"),
    reason="install.sh runs as root; the namespace cluster's hosts need iproute2 and nsenter",
)
@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secured"])
def test_install_lays_down_the_node_the_namespace_cluster_runs(
    tmp_path: Path, secure: bool
) -> None:
    sys.path.insert(0, str(REPO / "tools" / "cluster"))
    from node_cluster import Layout, NodeCluster, Settings
    from secured import Secured

    from gazette.testing.netns import Net

    with Net(Layout().hosts, directory=tmp_path) as net:
        host = net.hosts[Layout().summers[0]]  # An etcd member, a broker and a summer.
        hosts = {h.name: h.address for h in net.hosts}
        secured = Secured.make(tmp_path / "certs", hosts) if secure else None
        contract = NodeCluster(net, Layout(), Settings(), secured).env(host)
    # What the VM has elsewhere: install.sh decides where the package and examples are.
    installed = {"GAZETTE_PYTHON": INSTALLED_PYTHON, "GAZETTE_EXAMPLES": INSTALLED_EXAMPLES}
    passed = {k: v for k, v in contract.items() if k != "PATH" and k not in installed}
    dest = tmp_path / "root"
    roles = ["etcd", "broker", "summer"]
    argv = ["bash", str(INSTALL), "--repo", str(REPO), "--roles", " ".join(roles),
            "--dest", str(dest), *(f"{k}={v}" for k, v in passed.items())]  # fmt: skip

    first = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr

    script = dest / "usr/local/bin/gazette-node"
    assert script.read_bytes() == NODE.read_bytes() and script.stat().st_mode & 0o777 == 0o755
    for app in ("stream-sum", "word-count"):
        diff = subprocess.run(
            ["diff", "-qr", "--exclude=__pycache__", REPO / "examples" / app,
             dest / "opt/gazette/examples" / app],
            capture_output=True, text=True,
        )  # fmt: skip
        assert diff.returncode == 0, diff.stdout
    unit_dir = dest / "etc/systemd/system"
    assert sorted(p.name for p in unit_dir.iterdir()) == sorted(
        f"gazette-{r}.service" for r in roles
    )
    for unit in unit_dir.iterdir():
        assert unit.read_bytes() == (UNITS / unit.name).read_bytes()
    env_file = dest / "etc/gazette/node.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    node_env = environment_file(env_file.read_text())
    assert node_env == {**passed, **installed}

    for role in ROLES:
        on_vm = node(role, "--print", env={**node_env, "PATH": contract["PATH"]})
        on_host = node(role, "--print", env={**contract, **installed})
        assert on_vm.returncode == 0 and on_host.returncode == 0, on_vm.stderr + on_host.stderr
        assert on_vm.stdout == on_host.stdout

    again = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "updated" not in again.stdout, again.stdout + again.stderr


def test_vagrantfile_roles_have_units() -> None:
    text = (VAGRANT / "Vagrantfile").read_text()
    roles = {r for group in re.findall(r"roles: %w\[([^\]]*)\]", text) for r in group.split()}
    assert roles and roles <= set(DAEMONS), roles
    assert 'path: "provision/install.sh"' in text


# -- End to end on namespace hosts (cluster) ------------------------------------------------------

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"),
    reason="network namespaces need root, iproute2 and nsenter",
)


@pytest.mark.cluster
@needs_netns
def test_roles_started_through_gazette_node_sum_every_stream_once(tmp_path: Path) -> None:
    from gazette.testing.netns import Net
    from gazette.testing.s3 import MotoS3Server

    # h0-h2: an etcd member and a broker each; summers on h0 and h1, word-count on h1 and h2;
    # the S3 stand-in on h2. The specs are applied from h1, which runs both consumers.
    layout = {
        "h0": ["etcd", "broker", "summer"],
        "h1": ["etcd", "broker", "summer", "word-count"],
        "h2": ["etcd", "broker", "word-count", "s3"],
    }
    with Net(3, directory=tmp_path, keep=True) as net:
        hosts = {h.name: h for h in net.hosts}
        common = {
            **MotoS3Server.env(),
            "GAZETTE_ETCD_MEMBERS": ",".join(f"{h.name}={h.address}" for h in net.hosts),
            "GAZETTE_ETCD_TOKEN": net.tag,
            "GAZETTE_BROKERS": ",".join(f"{h.address}:8080" for h in net.hosts),
            "GAZETTE_S3": f"http://{hosts['h2'].address}:5000",
            "GAZETTE_PYTHON": sys.executable,
            "GAZETTE_EXAMPLES": str(REPO / "examples"),
            "GAZETTE_APPS": "stream-sum,word-count",
            "GAZETTE_LEASE_TTL": "5",
            "GAZETTE_DRAIN_TIMEOUT": "0",
        }

        def env_of(name: str) -> dict[str, str]:
            h = hosts[name]
            return {
                **common,
                "GAZETTE_NODE": h.name,
                "GAZETTE_IP": h.address,
                "GAZETTE_ZONE": f"zone-{int(h.name[1:]) % 2}",
                "GAZETTE_DATA": str(h.directory / "data"),
            }

        def on(name: str, *argv: str, timeout: float = 90) -> None:
            r = subprocess.run(
                hosts[name].command([str(NODE), *argv]),
                env={**os.environ, **env_of(name)},
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            assert r.returncode == 0, f"{name}: gazette-node {' '.join(argv)}:\n{r.stderr}"

        for role in ("etcd", "s3", "broker", "summer", "word-count"):
            for name, roles in layout.items():
                if role in roles:
                    hosts[name].popen(
                        [str(NODE), role],
                        env=env_of(name),
                        log=hosts[name].directory / f"{role}.log",
                    )
            # Then waited for: an etcd member is healthy only once a quorum of them runs.
            for name, roles in layout.items():
                if role in roles:
                    on(name, role, "--wait", "60")
        on("h1", "apply-journals")
        on("h1", "apply-shards")

        # Load through every broker, then the verdict.
        example_env = {**os.environ, "PYTHONPATH": str(REPO / "examples" / "stream-sum")}
        brokers = common["GAZETTE_BROKERS"]
        record = tmp_path / "run.jsonl"
        chunker = subprocess.run(
            [sys.executable, "-m", "stream_sum.chunker", "--broker", brokers, "--streams", "300",
             "--chunks", "10", "--concurrency", "30", "--rate", "1500", "--record", str(record)],
            env=example_env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert chunker.returncode == 0, chunker.stderr[-3000:]
        verifier = subprocess.run(
            [sys.executable, "-m", "stream_sum.verifier", "--broker", brokers,
             "--record", str(record), "--timeout", "60"],
            env=example_env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert verifier.returncode == 0, verifier.stdout + verifier.stderr[-3000:]
        assert "OK: 300/300 streams" in verifier.stdout, verifier.stdout

        # word-count counts what it is fed, asked through h2's consumer.
        wc_env = {**os.environ, "PYTHONPATH": str(REPO / "examples" / "word-count")}
        feed = subprocess.run(
            [sys.executable, "-m", "word_count.feed", "--broker", brokers.split(",")[0], "-"],
            input="to be or not to be\n", env=wc_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert feed.returncode == 0, feed.stderr

        def count() -> str:
            q = subprocess.run(
                [sys.executable, "-m", "word_count.query", "--consumer",
                 f"{hosts['h2'].address}:8092", "--ngram", "to be"],
                env=wc_env, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            return q.stdout

        from tests.kit.eventually import eventually_blocking

        eventually_blocking(
            lambda: re.search(r"^\s+2\s+to be$", count(), re.M),
            what="the count of 'to be' queried through word-count",
            timeout=30,
            interval=0.5,
        )
