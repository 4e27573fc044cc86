"""A saved dataset against the listing it resumes on: every saved shard still there and
unchanged (new shards are fine), and the same folder classes. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ingest.core.errors import StateError
from ingest.core.state.dataset import DatasetState
from ingest.core.state.packed import PackedFingerprint, size_hashes, version_hashes
from ingest.core.state.shards import ShardRecord, packed_digest

_AT_COMMIT = re.compile(r"^(hf://[^@]+)@([0-9a-f]{40})(/.*)?$")
"""A Hub shard's URL at a commit: the repository's part, the commit, the path."""
_HUB_SOURCE = re.compile(r"^(hf://(?:datasets|models|spaces)/[^/@]+/[^/@]+)(@[^/]*)?(/.*)?$")


def hub_commits(urls: Iterable[str]) -> dict[str, str]:
    """The commit the Hugging Face Hub shards among ``urls`` were listed at, by repository
    (``hf://datasets/<org>/<name>`` -> sha; the first shard's of each)."""
    out: dict[str, str] = {}
    for url in urls:
        found = _AT_COMMIT.match(url)
        if found is not None:
            out.setdefault(found.group(1), found.group(2))
    return out


def moved_from(commits: Mapping[str, str], urls: Iterable[str]) -> bool:
    """Whether a listing of ``urls`` holds a repository of ``commits`` (a state's) at
    another commit: its branch moved since the state was saved."""
    now = hub_commits(urls)
    return any(now.get(repo, sha) != sha for repo, sha in commits.items())


def _moved_commit(
    missing: Sequence[str], listed: Mapping[str, ShardRecord]
) -> tuple[str, str] | None:
    """The state's commit and the listing's where every one of the ``missing`` shards (Hub
    URLs at a commit) is in the listing at another commit, the same path: the branch read
    moved (a commit was pushed); None otherwise."""
    commits = hub_commits(listed)
    old = new = None
    for url in missing:
        found = _AT_COMMIT.match(url)
        if found is None or found.group(1) not in commits:
            return None
        repo, old, path = found.group(1), found.group(2), found.group(3) or ""
        new = commits[repo]
        if f"{repo}@{new}{path}" not in listed:
            return None
    return (old, new) if old is not None and new is not None else None


def _none_listed(
    saved: DatasetState | Sequence[ShardRecord],
    missing: Sequence[str],
    listed: Sequence[ShardRecord],
    by_url: Mapping[str, ShardRecord],
) -> StateError:
    """The refusal of a state none of whose shards (``missing``) is listed: a Hub branch that
    moved (:func:`_moved_commit`), else another dataset's."""
    moved = _moved_commit(missing, by_url)
    if moved is not None:
        changed = _changed_at(saved, moved, by_url)
        return _moved_error(saved, *moved, changed)
    return StateError(
        f"the state belongs to another dataset: none of its {len(missing)} shards (e.g. "
        f"{missing[0] if missing else '-'}) is in this listing of {len(listed)} shards "
        f"(e.g. {listed[0].url if listed else '-'}); load a state saved by this stream"
    )


def _changed_at(
    saved: DatasetState | Sequence[ShardRecord],
    commits: tuple[str, str],
    by_url: Mapping[str, ShardRecord],
) -> list[str]:
    """The state's shards whose file at the listing's commit is another (its size or version
    differs from the record's at the state's commit)."""
    old, new = commits
    if isinstance(saved, DatasetState) and saved.fingerprint is not None:
        return []  # (a packed state's records keep no sizes or versions: not told apart)
    shards = saved.shards if isinstance(saved, DatasetState) else saved
    return _changed(shards, {u.replace(f"@{new}/", f"@{old}/", 1): s for u, s in by_url.items()})


def _moved_error(
    saved: DatasetState | Sequence[ShardRecord], old: str, new: str, changed: Sequence[str]
) -> StateError:
    """The refusal of a state of a Hub branch that moved from commit ``old`` to ``new``."""
    sources = saved.sources if isinstance(saved, DatasetState) else []
    pinned = [
        _HUB_SOURCE.sub(lambda m: f"{m.group(1)}@{old}{m.group(3) or ''}", u) for u in sources
    ]
    at = ", ".join(pinned) or f"the URL with @{old} after the repository's name"
    rewritten = (
        f" ({len(changed)} of its shards are other files there: {', '.join(changed[:5])})"
        if changed
        else ""
    )
    return StateError(
        f"the Hub branch moved from commit {old[:12]} to {new[:12]} since the state was "
        f"saved (a commit was pushed){rewritten}: the state's shards are the files at "
        f"{old[:12]}. Resume "
        f"the state at its commit, named in the URL: {at} (every row of its epoch once); a "
        "stream over the branch starts its next epoch at the new commit without the state"
    )


def _match_formats(saved: Sequence[str], formats: Sequence[str]) -> None:
    """Refuse a state whose shards were read as a format this listing reads none as (a
    dataset that grew may add formats): rows are numbered per format, so the state's rows
    would be other rows (a CSV file's header is no row, a text file's first line is one)."""
    gone = [f for f in saved if f not in formats]
    if not gone:
        return
    raise StateError(
        f"the state's shards were read as {', '.join(saved)}, and this stream reads them as "
        f"{', '.join(formats) or 'nothing'}: a row's number depends on its format (a CSV "
        "file's header is no row, a text file's first line is one), so the state's rows "
        f"would be other rows. Pass format={gone[0]!r} as when the state was saved, or start "
        "without the state"
    )


def match_kinds(saved: DatasetState, classes: Sequence[str], formats: Sequence[str]) -> None:
    """Check that a folder dataset's class list (``classes``, the listing's) is the
    state's, and every format its shards were read as among ``formats`` (the listing's).

    Raises:
        StateError: Naming the classes added or gone, or the formats.
    """
    if tuple(saved.classes) != tuple(classes):
        gone = sorted(set(saved.classes) - set(classes))
        added = sorted(set(classes) - set(saved.classes))
        raise StateError(
            f"the folder dataset's classes changed since the state was saved (gone: "
            f"{gone[:5]}, added: {added[:5]}; {len(saved.classes)} -> {len(classes)}): its "
            "label indices would name other classes. Restore the class directories, or "
            "start without the state"
        )
    _match_formats(saved.formats, formats)


def match_listing(
    saved: DatasetState | Sequence[ShardRecord],
    listed: Sequence[ShardRecord],
    classes: Sequence[str] = (),
    formats: Sequence[str] = (),
) -> None:
    """Check that every saved shard is in ``listed``, unchanged. New shards are fine.

    Sizes are compared, and versions where both sides have one. A packed state (its sizes
    and versions kept as a digest and hashes) is checked against the digest first. A folder
    dataset's class list (``classes``, the listing's) must be the state's, and every format
    the state's shards were read as among ``formats`` (the listing's; a state that recorded
    none is not checked).

    Raises:
        StateError: Naming the shards that are missing or changed, and what changed, or the
            classes added or gone.
    """
    if isinstance(saved, DatasetState):
        match_kinds(saved, classes, formats)
    fingerprint = saved.fingerprint if isinstance(saved, DatasetState) else None
    shards = saved.shards if isinstance(saved, DatasetState) else saved
    by_url = {s.url: s for s in listed}
    missing = [s.url for s in shards if s.url not in by_url]
    if fingerprint is None:
        changed = _changed(shards, by_url)
    elif not missing and packed_digest([by_url[s.url] for s in shards]) == fingerprint.digest:
        return
    else:
        changed = _changed_hashed(shards, fingerprint, by_url)
    if not missing and not changed:
        if fingerprint is None or _some_version_unknown(shards, fingerprint, by_url):
            return
        raise StateError(
            f"the dataset changed since the state was saved: the digest of its "
            f"{len(shards)} shards is not the state's, so some shard was rewritten in place "
            "(its size or version changed), but the short hashes a packed state keeps per "
            "shard do not tell which. A state resumes only on the same shards; restore "
            "them or start the epoch without the state"
        )
    if len(missing) == len(shards):
        raise _none_listed(saved, missing, listed, by_url)
    parts = []
    if missing:
        parts.append(f"{len(missing)} shard(s) gone: {', '.join(missing[:5])}")
    if changed:
        parts.append(f"{len(changed)} shard(s) changed: {', '.join(changed[:5])}")
    raise StateError(
        f"the dataset changed since the state was saved: {'; '.join(parts)}. "
        "A state resumes only on the same shards (new shards may be added); "
        "restore them or start the epoch without the state"
    )


def match_needed(
    saved: DatasetState, needed: Sequence[int], listed: Sequence[ShardRecord], tables: str
) -> None:
    """Check only the saved shards at ``needed`` (those a state taken between epochs still
    points into: rows it carries into the next epoch, or owes) against ``listed``: the
    others may be gone or rewritten, as a Delta table's compaction leaves them (``tables``
    names the tables the state was listed with, for the message).

    Raises:
        StateError: Naming a needed shard gone or changed, and the fix.
    """
    by_url = {s.url: s for s in listed}
    shards = [saved.shards[n] for n in needed]
    missing = [s.url for s in shards if s.url not in by_url]
    fingerprint = saved.fingerprint
    if fingerprint is None:
        changed = _changed(shards, by_url)
    else:
        changed = _changed_hashed(saved.shards, fingerprint, by_url, needed)
    if missing or changed:
        raise StateError(
            f"the state carries rows of its last epoch into the next one (an epoch's rows "
            f"that did not fill a step), in shards {(missing + changed)[:3]} that are no "
            f"longer there as they were (the state was listed with {tables}): rewritten, "
            "removed, or given other deleted rows (a Delta deletion vector: a DELETE, UPDATE "
            "or MERGE) since. Restore them, or load no state (the epoch starts over); a run "
            "whose data changes between epochs can pass remainder='drop' (the rows that "
            "fill no step are dropped, and counted), so that its states carry none"
        )


def changed_shards(before: Sequence[ShardRecord], now: Sequence[ShardRecord]) -> list[str]:
    """The shards of ``before`` that ``now`` lists otherwise (another size or version: a
    file rewritten in place, a Delta file's other deletion vector), each with what changed;
    a shard ``now`` does not list is left out."""
    return _changed(before, {s.url: s for s in now})


def _changed(shards: Sequence[ShardRecord], by_url: Mapping[str, ShardRecord]) -> list[str]:
    changed = []
    for s in shards:
        now = by_url.get(s.url)
        if now is None:
            continue
        what = []
        if now.size != s.size:
            what.append(f"size {s.size} -> {now.size}")
        if s.version and now.version and now.version != s.version:
            what.append(f"version {s.version!r} -> {now.version!r}")
        if what:
            changed.append(f"{s.url} ({', '.join(what)})")
    return changed


def _changed_hashed(
    shards: Sequence[ShardRecord],
    fingerprint: PackedFingerprint,
    by_url: Mapping[str, ShardRecord],
    among: Sequence[int] | None = None,
) -> list[str]:
    """The shards (at ``among``, None: all) whose size or version hash differs (a packed
    state keeps no more)."""
    picked = range(len(shards)) if among is None else among
    found = [(n, by_url[shards[n].url]) for n in picked if shards[n].url in by_url]
    if not found:
        return []
    at = np.asarray([n for n, _ in found], dtype=np.int64)
    sizes = size_hashes([now.size for _, now in found])
    versions = version_hashes([now.version for _, now in found])
    saved_versions = fingerprint.version_hashes[at]
    size_differs = sizes != fingerprint.size_hashes[at]
    version_differs = (saved_versions != 0) & (versions != 0) & (versions != saved_versions)
    changed = []
    for k in np.flatnonzero(size_differs | version_differs).tolist():
        now = found[k][1]
        what = [f"size now {now.size}"] if size_differs[k] else []
        if version_differs[k]:
            what.append(f"version now {now.version!r}")
        changed.append(f"{now.url} ({', '.join(what)}, not as saved)")
    return changed


def _some_version_unknown(
    shards: Sequence[ShardRecord],
    fingerprint: PackedFingerprint,
    by_url: Mapping[str, ShardRecord],
) -> bool:
    """Whether a shard's version is unknown on one side only (so the digests may differ)."""
    now_unknown = np.asarray([by_url[s.url].version == "" for s in shards], dtype=bool)
    return bool(((fingerprint.version_hashes == 0) != now_unknown).any())
