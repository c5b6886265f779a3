"""gazctl: the command line of Gazette brokers and consumers.

    gazctl journals list -l app=clicks --format yaml
    gazctl journals apply --specs journals.yaml
    gazctl journals read -l name=a/journal --block
    gazctl journals read -l name=app/outputs --committed
    gazctl shards list -l app=word-count --lag
    gazctl shards stat -l app=word-count

Commands are grouped (`journals`; `shards` for shard specs, assignments and recovery logs,
which also take `--consumer`): each group module
exposes ``register(subparsers, common)``, adding its subcommands with the `common` options
(`--broker`, ...) and a coroutine handler ``handler(args, io) -> int``. `main` parses, runs the
handler on a fresh event loop and turns expected failures (broker statuses, invalid specs,
unreachable brokers, bad files) into one ``gazctl: error: ...`` line and exit status 1.
Every option's ``--help`` says its default (`HelpFormatter`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import grpc
import grpc.aio

from gazette.auth.client_settings import ClientSettings
from gazette.auth.tls import ClientTLS, TLSConfigError
from gazette.broker.client.appender import AppendRetriesExhausted
from gazette.broker.client.errors import BrokerError
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.fragment.store import FragmentStoreError
from gazette.broker.protocol.errors import ValidationError

__all__ = [
    "main",
    "run",
    "Streams",
    "GazctlError",
    "TransactionTooLarge",
    "raise_if_txn_too_large",
    "kept_edit_error",
    "build_parser",
    "DEFAULT_BROKER",
    "HelpFormatter",
    "journal_client",
]

DEFAULT_BROKER = "127.0.0.1:8080"


class GazctlError(Exception):
    """A usage or input problem, reported as one line without a traceback.

    `exit_status` is the status gazctl exits with (1 unless a subclass says otherwise).
    """

    exit_status = 1


class TransactionTooLarge(GazctlError):
    """An apply has more changes than etcd takes in one transaction (its ``--max-txn-ops``,
    128 by default)."""


def kept_edit_error(err: Exception, edited: str, apply_command: str) -> GazctlError:
    """The error of an ``edit`` whose result could not be applied: the edited text is kept
    in a new file (so the edit is not lost), which the message names with the command that
    applies it once fixed. The caller raises it from `err`."""
    fd, path = tempfile.mkstemp(prefix="gazctl-edit-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(edited)
    out = GazctlError(
        f"{err} (the edit is kept in {path}: fix it, then `gazctl {apply_command} --specs {path}`)"
    )
    out.exit_status = err.exit_status if isinstance(err, GazctlError) else 1
    return out


ETCD_TOO_MANY_OPS = "too many operations in txn request"
"""What etcd answers a transaction with more operations than its ``--max-txn-ops``."""


def raise_if_txn_too_large(err: BaseException, changes: int, txn_size: int) -> None:
    """Raise `TransactionTooLarge` (from `err`) if `err` is etcd refusing an apply's
    transaction for its size; otherwise return. `changes` is the apply's number of changes,
    `txn_size` its ``--max-txn-size`` (0: one transaction)."""
    details = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
    if ETCD_TOO_MANY_OPS not in (details or ""):
        return
    sent = f"{txn_size} changes per transaction" if txn_size else f"all {changes} changes in one"
    raise TransactionTooLarge(
        f"the apply is too large for one etcd transaction ({sent}; etcd takes at most "
        "--max-txn-ops operations per transaction, 128 by default): apply in batches with "
        "--max-txn-size 100 (each batch is then its own transaction, so a failure can leave "
        "earlier batches applied), or select fewer specs"
    ) from err


@dataclass
class Streams:
    """Where commands read input and write output (the process's std streams by default)."""

    stdin: IO[bytes] = field(default_factory=lambda: sys.stdin.buffer)
    stdout: IO[bytes] = field(default_factory=lambda: sys.stdout.buffer)
    stderr: IO[str] = field(default_factory=lambda: sys.stderr)

    def out(self, text: str) -> None:
        """Write `text` (plus a newline) to stdout."""
        self.stdout.write(text.encode() + b"\n")
        self.stdout.flush()

    async def read_input(self, path: str) -> str:
        """The text of file `path`, or of stdin for ``-``."""
        if path == "-":
            return (await asyncio.to_thread(self.stdin.read)).decode()
        return Path(path).read_text()

    def err(self, text: str) -> None:
        """Write `text` (plus a newline) to stderr."""
        self.stderr.write(text + "\n")
        self.stderr.flush()


class HelpFormatter(argparse.HelpFormatter):
    """Help whose options say their defaults: ``(default: X)`` is added to each option having
    a default worth saying (not None, empty or False) unless its help mentions it already.
    A description of several lines keeps its line breaks (it holds examples); one of a single
    line is wrapped."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip("\n"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default in (None, "", False, argparse.SUPPRESS)
            or default == []
        ):
            return text
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """gazctl's parsers: `HelpFormatter` unless told otherwise, which the subcommands'
    parsers inherit (argparse makes them of their parent parser's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


class Handler(Protocol):
    async def __call__(self, args: argparse.Namespace, io: Streams) -> int: ...


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("broker")
    g.add_argument(
        "--broker",
        "--broker.address",
        dest="broker",
        default=os.environ.get("BROKER_ADDRESS", DEFAULT_BROKER),
        help="broker endpoint, e.g. 127.0.0.1:8080, http://host:8080 or https://host:8080 (TLS) "
        "(env BROKER_ADDRESS; default %(default)s)",
    )
    for flag, variable, text in (
        ("cert-file", "BROKER_CERT_FILE", "the client's TLS certificate (PEM), if the broker asks"),
        ("cert-key-file", "BROKER_CERT_KEY_FILE", "the private key of --cert-file (PEM)"),
        (
            "trusted-ca-file",
            "BROKER_TRUSTED_CA_FILE",
            "the CA (PEM) the broker's certificate must be signed by (default: the system's); "
            "any of these three makes the connection TLS, as an https:// --broker does",
        ),
    ):
        g.add_argument(
            f"--{flag}",
            f"--broker.{flag}",
            dest=flag.replace("-", "_"),
            metavar="FILE",
            default=os.environ.get(variable) or None,
            help=f"{text} (env {variable})",
        )
    g.add_argument(
        "--auth-keys",
        "--broker.auth-keys",
        dest="auth_keys",
        metavar="KEYS",
        default=None,
        help="base64 keys, separated by whitespace or commas, the first signing each call to "
        "brokers for what it does (env BROKER_AUTH_KEYS; default: none)",
    )
    g.add_argument(
        "--auth-token",
        "--broker.auth-token",
        dest="auth_token",
        metavar="TOKEN",
        default=None,
        help="a bearer token sent with every call to brokers, instead of --auth-keys "
        "(env BROKER_AUTH_TOKEN)",
    )
    g.add_argument(
        "--zone",
        default=os.environ.get("ZONE", ""),
        help="availability zone of this client, to prefer same-zone brokers for reads",
    )
    return common


def journal_client(args: argparse.Namespace) -> JournalClient:
    """A client of `args.broker`, with the TLS of ``--cert-file``, ``--cert-key-file`` and
    ``--trusted-ca-file`` if any is given (a file that cannot be used is a `GazctlError`)."""
    files = (args.trusted_ca_file, args.cert_file, args.cert_key_file)
    tls = ClientTLS(*files) if any(f is not None for f in files) else None
    settings = ClientSettings(
        auth_keys=_flag_or_env(args.auth_keys, "BROKER_AUTH_KEYS"),
        auth_token=_flag_or_env(args.auth_token, "BROKER_AUTH_TOKEN"),
    )
    try:
        auth = settings.authorizer()
    except ValueError as err:
        raise GazctlError(f"--auth-keys/--auth-token: {err}") from None
    try:
        return JournalClient(args.broker, zone=args.zone, tls=tls, auth=auth)
    except TLSConfigError as err:
        raise GazctlError(str(err)) from None


def _flag_or_env(value: str | None, variable: str) -> str:
    """A secret flag's value, else its environment variable's (never a parser default, so
    that --help never shows it)."""
    return value if value is not None else os.environ.get(variable, "")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser of gazctl."""
    from gazette.gazctl import attach_uuids, journals, shards

    parser = ArgumentParser(
        prog="gazctl", description="Command line interface of Gazette brokers and consumers."
    )
    groups = parser.add_subparsers(dest="group", metavar="GROUP", required=True)
    common = _common_options()
    journals.register(groups, common)
    attach_uuids.register(groups, common)
    shards.register(groups, common)
    return parser


def _describe_rpc_error(err: grpc.aio.AioRpcError, args: argparse.Namespace) -> str:
    code = err.code()
    details = err.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        broker = str(getattr(args, "broker", "?"))
        hint = ""
        plaintext = (
            not broker.startswith("https://") and getattr(args, "trusted_ca_file", None) is None
        )
        if plaintext and "Socket closed" in details:
            # What a plaintext client sees of a TLS server: the server hangs up on it.
            hint = (
                " (if the broker serves TLS, give --trusted-ca-file (BROKER_TRUSTED_CA_FILE) or "
                "an https:// --broker)"
            )
        return f"broker {broker} is unavailable: {details}{hint}"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return (
            f"broker refused the call (UNAUTHENTICATED): {details}; give --auth-keys "
            "(BROKER_AUTH_KEYS) or --auth-token (BROKER_AUTH_TOKEN) (docs/security.md)"
        )
    return f"RPC failed ({code.name}): {details}"


def run(argv: Sequence[str] | None = None, io: Streams | None = None) -> int:
    """Run gazctl with `argv` (default: sys.argv[1:]) and `io`; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    io = io or Streams()
    handler: Handler = args.handler
    try:
        return asyncio.run(handler(args, io))
    except KeyboardInterrupt:
        io.err("gazctl: interrupted")
        return 130
    except BrokenPipeError:
        return 1
    except GazctlError as err:
        io.err(f"gazctl: error: {err}")
        return err.exit_status
    except (
        AppendRetriesExhausted,
        BrokerError,
        ValidationError,
        FragmentStoreError,
    ) as err:
        io.err(f"gazctl: error: {err}")
    except grpc.aio.AioRpcError as err:
        io.err(f"gazctl: error: {_describe_rpc_error(err, args)}")
    except OSError as err:
        io.err(f"gazctl: error: {err}")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: ``gazctl ...``."""
    os.umask(0o077)  # Files gazctl writes (recoveries, offsets) are private: docs/file-modes.md
    return run(argv)


if __name__ == "__main__":
    # Run as ``python -m gazette.gazctl.main``, this file is the module ``__main__``, while the
    # commands raise the errors of ``gazctl.main``: call that module's `main`, so that its
    # `run` catches them (else they'd end in tracebacks).
    from gazette.gazctl.main import main as _main

    sys.exit(_main())
