"""The ``s3://bucket/prefix/`` fragment store, via boto3.

Query arguments (names match case-insensitively, as upstream's):

- ``endpoint``: an S3-compatible endpoint, e.g. ``http://127.0.0.1:9000``; path-style
  addressing is then used (bucket-named virtual hosts do not work with explicit endpoints);
- ``region``, ``profile``: as in the AWS shared config; credentials come from the environment,
  the profile or instance metadata, as boto3 resolves them;
- ``ACL``, ``storageclass``, ``SSE``, ``SSEKMSKeyId``: applied to objects we write;
- ``find``, ``replace``: content path rewriting (see `Rewriter`).

Fragments are uploaded with s3transfer (a single PutObject below the multipart threshold,
multipart above it, since fragments may exceed PutObject's 5 GiB limit).
GZIP_OFFLOAD_DECOMPRESSION objects carry ``Content-Encoding: gzip``; boto3 never decodes
bodies, so we always read the stored bytes and decompress them ourselves.
"""

from __future__ import annotations

from gazette._extras import require

require("an s3:// fragment store", "s3", "boto3")

import asyncio
import builtins
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import boto3
import boto3.s3.transfer
import botocore.config
import botocore.exceptions

from gazette.broker.fragment.codecs import CHUNK_SIZE
from gazette.broker.fragment.store import (
    HEALTH_PROBE_CONTENT,
    HEALTH_PROBE_PATH,
    FragmentStoreError,
    compress_verified,
    content_path,
    decompress_verified,
    parse_listed,
    parse_store_query,
    rewriter_from,
    verify_local,
    with_store,
)
from gazette.broker.protocol import protocol_pb2 as pb

_ARGS = (
    "find",
    "replace",
    "profile",
    "endpoint",
    "ACL",
    "storageclass",
    "SSE",
    "SSEKMSKeyId",
    "region",
)
_MULTIPART = 64 << 20
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}

_ErrorTypes = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError)
T = TypeVar("T")


def _error_code(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


class S3Store:
    """A `FragmentStore` over an S3 bucket prefix. See the module docstring."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise FragmentStoreError(f"store {url}: expected s3://bucket/prefix/")
        if not parsed.path.endswith("/"):
            raise FragmentStoreError(f"store {url}: path must end in '/'")
        self.bucket = parsed.netloc
        self.prefix = urllib.parse.unquote(parsed.path[1:])  # Keys have no leading '/'.
        args = parse_store_query(url, parsed.query, _ARGS)
        self.rewriter = rewriter_from(args)
        self.endpoint = args.get("endpoint", "")

        self._put_args: dict[str, str] = {}
        for arg, param in (
            ("ACL", "ACL"),
            ("storageclass", "StorageClass"),
            ("SSE", "ServerSideEncryption"),
            ("SSEKMSKeyId", "SSEKMSKeyId"),
        ):
            if args.get(arg):
                self._put_args[param] = args[arg]

        config = botocore.config.Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"} if self.endpoint else None,
            retries={"mode": "standard", "max_attempts": 5},
        )
        try:
            session = boto3.session.Session(
                profile_name=args.get("profile") or None,
                region_name=args.get("region") or None,
            )
            self._client: Any = session.client(
                "s3", endpoint_url=self.endpoint or None, config=config
            )
        except botocore.exceptions.BotoCoreError as exc:
            raise FragmentStoreError(f"store {url}: constructing S3 client: {exc}") from exc
        self._transfer = boto3.s3.transfer.TransferConfig(
            multipart_threshold=_MULTIPART, multipart_chunksize=_MULTIPART
        )

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    def key_of(self, fragment: pb.Fragment) -> str:
        """The object key holding `fragment`."""
        return self.prefix + self.rewriter.rewrite(content_path(fragment))

    async def _call(self, op: str, key: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except FragmentStoreError:
            raise
        except _ErrorTypes as exc:
            raise FragmentStoreError(
                f"store {self.url}: {op} s3://{self.bucket}/{key}: {exc}"
            ) from exc

    # -- list ------------------------------------------------------------------------------

    async def list(self, journal: str) -> list[pb.Fragment]:
        prefix = self.prefix + self.rewriter.rewrite(journal + "/")
        return await self._call("listing", prefix, self._list, journal, prefix)

    def _list(self, journal: str, prefix: str) -> builtins.list[pb.Fragment]:
        out: builtins.list[pb.Fragment] = []
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", ()):
                key: str = obj["Key"]
                if key.endswith("/"):
                    continue  # Directory placeholder objects.
                mod_time = int(obj["LastModified"].timestamp())
                frag = parse_listed(self.url, journal, key[len(prefix) :], mod_time)
                if frag is not None:
                    out.append(frag)
        return out

    # -- exists / persist ------------------------------------------------------------------

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            head: dict[str, Any] = self._client.head_object(Bucket=self.bucket, Key=key)
            return head
        except botocore.exceptions.ClientError as exc:
            if _error_code(exc) in _NOT_FOUND:
                return None
            raise

    async def exists(self, fragment: pb.Fragment) -> bool:
        key = self.key_of(fragment)
        return await self._call("checking", key, self._head, key) is not None

    async def persist(self, fragment: pb.Fragment, local_path: Path) -> pb.Fragment:
        key = self.key_of(fragment)
        return await self._call("persisting", key, self._persist, fragment, local_path, key)

    def _persist(self, fragment: pb.Fragment, local_path: Path, key: str) -> pb.Fragment:
        head = self._head(key)
        if head is not None:
            return with_store(fragment, self.url, int(head["LastModified"].timestamp()))

        where = f"store {self.url}: persisting s3://{self.bucket}/{key}"
        extra = dict(self._put_args)
        if fragment.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            extra["ContentEncoding"] = "gzip"  # Lets HTTP clients decompress on the fly.

        if fragment.compression_codec == pb.NONE:
            verify_local(fragment, local_path, where)
            self._client.upload_file(
                str(local_path), self.bucket, key, ExtraArgs=extra, Config=self._transfer
            )
        else:
            # Stage compressed content beside the spool, where there is room for it.
            with tempfile.TemporaryFile(dir=local_path.parent) as tmp:
                compress_verified(fragment, local_path, tmp, where)
                tmp.seek(0)
                self._client.upload_fileobj(
                    tmp, self.bucket, key, ExtraArgs=extra, Config=self._transfer
                )
        return with_store(fragment, self.url, int(time.time()))

    # -- reads -----------------------------------------------------------------------------

    async def fetch(self, fragment: pb.Fragment, dest: Path) -> None:
        key = self.key_of(fragment)
        await self._call("fetching", key, self._fetch, fragment, dest, key)

    def _fetch(self, fragment: pb.Fragment, dest: Path, key: str) -> None:
        resp = self._client.get_object(Bucket=self.bucket, Key=key)
        body = resp["Body"]
        try:
            decompress_verified(
                fragment, body, dest, f"store {self.url}: fetching s3://{self.bucket}/{key}"
            )
        finally:
            body.close()

    async def open_raw(self, fragment: pb.Fragment) -> AsyncIterator[bytes]:
        key = self.key_of(fragment)
        resp = await self._call(
            "opening", key, lambda: self._client.get_object(Bucket=self.bucket, Key=key)
        )
        body = resp["Body"]
        try:
            while chunk := await self._call("reading", key, body.read, CHUNK_SIZE):
                yield chunk
        finally:
            body.close()

    async def sign_get_url(self, fragment: pb.Fragment, ttl_seconds: float) -> str:
        key = self.key_of(fragment)
        url: str = await self._call(
            "signing",
            key,
            lambda: self._client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": key},
                ExpiresIn=max(1, int(ttl_seconds)),
            ),
        )
        return url

    # -- remove / health -------------------------------------------------------------------

    async def remove(self, fragment: pb.Fragment) -> None:
        key = self.key_of(fragment)
        await self._call(
            "removing", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=key)
        )

    async def health(self) -> None:
        key = self.prefix + self.rewriter.rewrite(HEALTH_PROBE_PATH)
        await self._call("health check of", key, self._health, key)

    def _health(self, key: str) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as exc:
            code = _error_code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise FragmentStoreError(
                    f"store {self.url}: bucket {self.bucket!r} does not exist"
                ) from exc
            if code in ("403", "AccessDenied", "Forbidden"):
                raise FragmentStoreError(
                    f"store {self.url}: access to bucket {self.bucket!r} denied"
                ) from exc
            raise
        self._client.put_object(
            Bucket=self.bucket, Key=key, Body=HEALTH_PROBE_CONTENT, **self._put_args
        )
        got = self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        if got != HEALTH_PROBE_CONTENT:
            raise FragmentStoreError(
                f"store {self.url}: health check of s3://{self.bucket}/{key}: read back "
                f"{got!r}, wrote {HEALTH_PROBE_CONTENT!r}"
            )
