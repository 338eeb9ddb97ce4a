"""The service behind vLLM's own router: ``vllm-router --policy consistent_hash``, for real.

Two real vLLM servers, the router in front of them, and two ``botctl serve``
workers on one PostgreSQL whose only engine URL is the router's: the service
ranks nothing, the router picks the replica by the ``x-session-id`` header
the service sends. Measured from the turns' own rows: the share of cacheable
prompt tokens (the previous prompt + reply's full blocks) that the replica
served from its prefix cache, over every answered turn after a
conversation's first.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest

from bot.doctor.router import detect_router
from bot.storage.models import Turn, TurnStatus, as_utc, utcnow
from bot.testing.vllm_router import VLLMRouter, start_router
from bot.testing.vllm_servers import API_KEY, VLLMServer, free_port, start_servers
from tests.conftest import TEST_BLOCK_SIZE, issue_key, migrated_postgres_database
from tests.helpers import auth, load_turns
from tests.remote.test_bot_workers import Worker, start_worker, wait_healthy, worker_env

pytestmark = pytest.mark.postgres
CONVERSATIONS = 6
TURNS = 8  # 48 messages
SALT_SECRET = "one-salt-secret-for-every-worker"


@pytest.fixture(scope="module")
def consistent_hash_router(
    vllm_servers: list[VLLMServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMRouter]:
    router = start_router(
        [server.base_url for server in vllm_servers], tmp_path_factory.mktemp("router")
    )
    yield router
    router.stop()


def routed_env(
    db_url: str, name: str, router: VLLMRouter, model: Path, max_tokens: int
) -> dict[str, str]:
    env = worker_env(db_url, name, free_port(), [], model)
    env.update(
        {
            "BOT_ENGINE__BASE_URLS": json.dumps([router.base_url]),
            "BOT_GENERATION__MAX_TOKENS": str(max_tokens),
            "BOT_LIMITS__MESSAGES_PER_MINUTE": "0",  # 48 messages at once from one key
            # The finding this deployment rests on: every worker the same salt key, or a
            # conversation that moves to the other worker misses the cache.
            "BOT_TENANCY__CACHE_SALT_SECRET": SALT_SECRET,
        }
    )
    return env


def stop(workers: list[Worker]) -> None:
    for worker in workers:
        if worker.process.poll() is None:
            os.killpg(worker.process.pid, signal.SIGTERM)
            try:
                worker.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait(10)


async def post_all(workers: list[Worker], key: str, conversations: int, turns: int) -> list[str]:
    """Every message at once, turn by turn, alternating workers: the turn ids accepted."""
    posts = [(f"conv-{c}", turn) for turn in range(turns) for c in range(conversations)]

    async def post(http: aiohttp.ClientSession, index: int, conv: str, turn: int) -> str:
        async with http.post(
            f"{workers[index % len(workers)].url}/v1/messages",
            json={"conversation_id": conv, "message_id": f"m{turn}", "text": f"{conv} says {turn}"},
            headers=auth(key),
        ) as response:
            assert response.status == 202, await response.text()
            return str((await response.json())["turn_id"])

    async with aiohttp.ClientSession() as http:
        return list(await asyncio.gather(*(post(http, i, c, t) for i, (c, t) in enumerate(posts))))


async def wait_final(db_url: str, timeout_s: float = 240.0) -> list[Turn]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        turns = await load_turns(db_url)
        if all(turn.status in TurnStatus.FINAL for turn in turns):
            return turns
        await asyncio.sleep(0.3)
    stuck = [(t.conversation_id, t.seq, t.status) for t in await load_turns(db_url)]
    raise AssertionError(f"turns still not final after {timeout_s} s: {stuck}")


def cache_reuse(turns: list[Turn], skip: frozenset[str] = frozenset()) -> tuple[int, int]:
    """(cached, cacheable) prompt tokens over the answered turns after each conversation's
    first (but those in ``skip``): cacheable is the previous answered prompt + reply's full
    blocks (the KV of a reply's last token is never computed)."""
    by_conversation: dict[str, list[Turn]] = defaultdict(list)
    for turn in turns:
        if turn.status == TurnStatus.DONE:
            by_conversation[turn.conversation_id].append(turn)
    cached = cacheable = 0
    for answered in by_conversation.values():
        answered.sort(key=lambda turn: turn.seq)
        for previous, current in itertools.pairwise(answered):
            # A resumed turn's prompt count holds the reply ids it carried to the engine
            # again: its prompt + reply overstate what the next turn can find cached.
            if current.id in skip or previous.resumes:
                continue
            full = (
                ((previous.prompt_tokens or 0) + (previous.completion_tokens or 0) - 1)
                // TEST_BLOCK_SIZE
                * TEST_BLOCK_SIZE
            )
            cacheable += full
            cached += min(current.cached_tokens or 0, full)
    return cached, cacheable


def routed_sessions(router: VLLMRouter) -> dict[str, set[str]]:
    """Session key -> the replicas the router sent it to, from the router's own log."""
    routed: dict[str, set[str]] = defaultdict(set)
    for key, worker in re.findall(
        r"Consistent hash routing: key='header:x-session-id:([^']+)' -> worker='([^']+)'",
        router.log_text(),
    ):
        routed[key].add(worker)
    return routed


async def test_behind_the_router_a_killed_worker_costs_no_cached_token(
    vllm_servers: list[VLLMServer],
    consistent_hash_router: VLLMRouter,
    demo_model_dir: Path,
    tmp_path: Path,
) -> None:
    router = consistent_hash_router
    async with migrated_postgres_database() as db_url:
        key = await issue_key(db_url)
        workers = [
            start_worker(name, routed_env(db_url, name, router, demo_model_dir, 24), tmp_path)
            for name in ("w1", "w2")
        ]
        try:
            await asyncio.gather(*(wait_healthy(worker) for worker in workers))
            accepted = await post_all(workers, key, CONVERSATIONS, TURNS)
            # SIGKILL w1 once a quarter of the turns are answered: w2 takes its leases over.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                turns = await load_turns(db_url)
                if sum(turn.status == TurnStatus.DONE for turn in turns) >= len(accepted) // 4:
                    break
                await asyncio.sleep(0.1)
            workers[0].process.kill()
            workers[0].process.wait(10)
            turns = await wait_final(db_url)
        finally:
            stop(workers)

    assert sorted(turn.id for turn in turns) == sorted(accepted)
    failed = [turn for turn in turns if turn.status != TurnStatus.DONE]
    # At most the turns w1 was generating when it died (one a conversation) fail, as
    # without a router; the resume of a dead worker's turn is bot/turns' business.
    assert len(failed) <= CONVERSATIONS, [(t.seq, t.error_message) for t in failed]
    cached, cacheable = cache_reuse(turns)
    print(f"reuse through the router, worker killed: {cached}/{cacheable}")
    assert cacheable > 0 and cached / cacheable >= 0.99, (cached, cacheable)
    # The header reached the router, and each conversation stayed on one replica.
    routed = routed_sessions(router)
    conversation_ids = {turn.conversation_id for turn in turns}
    assert conversation_ids <= set(routed), (conversation_ids, set(routed))
    assert all(len(routed[conversation]) == 1 for conversation in conversation_ids), routed


@dataclass
class ReplicaKilled:
    accepted: list[str]
    turns: list[Turn]
    in_flight_at_kill: int
    killed_at: datetime
    moved: set[str]
    """The conversations the router had sent to the killed replica."""

    def first_turns_after_the_move(self) -> frozenset[str]:
        """Each moved conversation's first turn answered after the kill: its prompt's KV
        died with the replica, nowhere to hit."""
        firsts = set()
        for conversation in self.moved:
            after = sorted(
                (
                    turn
                    for turn in self.turns
                    if turn.conversation_id == conversation
                    and turn.status == TurnStatus.DONE
                    and turn.finished_at is not None
                    and as_utc(turn.finished_at) > self.killed_at
                ),
                key=lambda turn: turn.seq,
            )
            if after:
                firsts.add(after[0].id)
        return frozenset(firsts)


async def kill_while_decoding(victim: VLLMServer, db_url: str, done_at_least: int) -> int:
    """SIGKILL ``victim`` once ``done_at_least`` turns are answered (the conversations have a
    history to lose) and while it decodes: requests running, its generated-token count
    rising, so a reply is cut after it began to stream. Returns the requests running."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        turns = await load_turns(db_url)
        if sum(turn.status == TurnStatus.DONE for turn in turns) >= done_at_least:
            break
        await asyncio.sleep(0.1)
    before = victim.metric("vllm:generation_tokens_total")
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        running = victim.metric("vllm:num_requests_running")
        generated = victim.metric("vllm:generation_tokens_total")
        if running and generated > before:
            victim.kill()
            return int(running)
        before = generated
    victim.kill()
    return 0


@pytest.fixture(scope="module")
async def replica_killed_run(
    vllm_servers: list[VLLMServer],
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ReplicaKilled]:
    """48 messages through the router over a replica of this module's own and a session
    replica; the own one is SIGKILLed while it streams replies, early in the chats."""
    logs = tmp_path_factory.mktemp("replica-killed")
    [victim] = await asyncio.to_thread(start_servers, demo_model_dir, logs, 1)
    router: VLLMRouter | None = None
    try:
        router = start_router([victim.base_url, vllm_servers[0].base_url], logs)
        async with migrated_postgres_database() as db_url:
            key = await issue_key(db_url)
            workers = [
                start_worker(name, routed_env(db_url, name, router, demo_model_dir, 48), logs)
                for name in ("w1", "w2")
            ]
            try:
                await asyncio.gather(*(wait_healthy(worker) for worker in workers))
                accepted = await post_all(workers, key, 8, 6)
                running = await kill_while_decoding(victim, db_url, done_at_least=8)
                killed_at = utcnow()
                assert running, "the victim was never seen decoding"
                turns = await wait_final(db_url)
            finally:
                stop(workers)
        moved = {key for key, seen in routed_sessions(router).items() if victim.base_url in seen}
        yield ReplicaKilled(accepted, turns, running, killed_at, moved)
    finally:
        if router is not None:
            router.stop()
        victim.stop()


async def test_behind_the_router_a_killed_replica_loses_no_message(
    replica_killed_run: ReplicaKilled,
) -> None:
    run = replica_killed_run
    assert sorted(turn.id for turn in run.turns) == sorted(run.accepted), "nothing stuck"
    # The replies the replica was streaming go on from their saved token ids on the
    # replica the router picks next: every message ends done.
    assert [turn for turn in run.turns if turn.status != TurnStatus.DONE] == []
    resumed = [turn for turn in run.turns if turn.resumes]
    assert resumed, "no reply was cut by the kill"
    # Only replies the dead replica was serving (running or waiting there) were resumed.
    assert {turn.conversation_id for turn in resumed} <= run.moved, (resumed, run.moved)
    # The dead replica's KV went with it: each of its conversations recomputes its prompt
    # once on the other replica, then hits again; every other turn hits.
    assert run.moved, "the killed replica served some conversations"
    cached, cacheable = cache_reuse(run.turns)
    print(
        f"reuse through the router, replica killed: {cached}/{cacheable}, resumed "
        f"{len(resumed)} of {len(run.turns)}, {len(run.moved)} conversations moved"
    )
    cached, cacheable = cache_reuse(run.turns, skip=run.first_turns_after_the_move())
    print(f"  without each moved conversation's first turn after the kill: {cached}/{cacheable}")
    assert cacheable > 0 and cached / cacheable >= 0.99, (cached, cacheable)


async def test_doctor_sees_the_router_and_its_replicas(
    vllm_servers: list[VLLMServer], consistent_hash_router: VLLMRouter
) -> None:
    async with aiohttp.ClientSession() as http:
        found = await detect_router(http, consistent_hash_router.base_url, API_KEY)
        direct = await detect_router(http, vllm_servers[0].base_url, API_KEY)
    assert found is not None and found.kind == "vllm-router"
    assert sorted(found.replicas) == sorted(server.base_url for server in vllm_servers)
    assert found.healthy == 2
    assert direct is None, "a vLLM server is not a router"
