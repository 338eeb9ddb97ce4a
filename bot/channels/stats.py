"""What ``/stats`` answers on the chat platforms: a user's day, or every user's for an admin.

The figures come from ``bot.turns.usage``; this module only words them, once
for every platform (plain text: Telegram sends it without a parse mode, Slack
shows it as it is). Days are UTC, like the token allowance, and the answer
says so.

``/stats all`` shows every user of the bot (Telegram) or app (Slack) today. It
is for the platform's admin users only; who they are is the channel's setting,
handed in as an ``AdminCheck``. Until one is configured nobody is an admin
(``NO_ADMINS``) and ``/stats all`` answers that it is for admins.
"""

from __future__ import annotations

from collections.abc import Callable

from bot.turns.limits import user_subject
from bot.turns.usage import Today, UsageQuery, UsageReports, UsageRow, cache_share

AdminCheck = Callable[[str], bool]
"""Whether the platform user id is an admin of this bot or app."""

MAX_USERS_LISTED = 30
"""``/stats all`` lists the heaviest users first, this many (a Telegram message is 4096 chars)."""
NOT_ADMIN_TEXT = "Only the bot's admins can see everyone's usage. /stats shows yours."
NO_USER_TEXT = "I cannot tell who sent this, so I have no usage to show."


def no_admins(_user_id: str) -> bool:
    return False


NO_ADMINS: AdminCheck = no_admins


def _share(cached: int, prompt: int) -> str:
    share = cache_share(cached, prompt)
    return "-" if share is None else f"{share:.0%}"


def _turns(done: int, failed: int, stopped: int) -> str:
    text = f"{done} answered"
    if failed:
        text += f", {failed} failed"
    return f"{text}, {stopped} stopped" if stopped else text


def user_stats_text(today: Today, *, admin: bool = False) -> str:
    """A user's turns and tokens today, and how much of the daily allowance is spent.

    Admins are held to no fair-use limit, so theirs reads "none" whatever the config says.
    """
    lines = [
        f"Your usage today ({today.day.isoformat()}, UTC):",
        f"Messages: {_turns(today.turns_done, today.turns_failed, today.turns_stopped)}",
        f"Prompt tokens: {today.prompt_tokens:,}, "
        f"{_share(today.cached_tokens, today.prompt_tokens)} served from the cache",
        f"Generated tokens: {today.completion_tokens:,}",
    ]
    if admin:
        lines.append(f"Daily limit: none, you are an admin ({today.counted_tokens:,} counted).")
    elif today.tokens_per_day:
        used = today.counted_tokens / today.tokens_per_day
        lines.append(
            f"Daily limit: {today.counted_tokens:,} of {today.tokens_per_day:,} tokens "
            f"used ({used:.0%}); cached prompt tokens do not count. Resets at 00:00 UTC."
        )
    else:
        lines.append(f"Daily limit: none ({today.counted_tokens:,} tokens counted today).")
    return "\n".join(lines)


def channel_stats_text(rows: list[UsageRow], *, day: str) -> str:
    """Every user's turns and tokens today, heaviest first (an admin's ``/stats all``)."""
    if not rows:
        return f"Nobody has used the bot today ({day}, UTC)."
    ranked = sorted(rows, key=lambda r: (-(r.prompt_tokens + r.completion_tokens), r.user_id or ""))
    lines = [f"Usage today ({day}, UTC), {len(rows)} user{'s' if len(rows) != 1 else ''}:"]
    for row in ranked[:MAX_USERS_LISTED]:
        who = row.user_id or "?"
        if row.user_name:
            who = f"{row.user_name} ({who})"
        lines.append(
            f"{who}: {_turns(row.turns_done, row.turns_failed, row.turns_stopped)}; "
            f"{row.prompt_tokens:,} prompt tokens ({_share(row.cached_tokens, row.prompt_tokens)}"
            f" cached), {row.completion_tokens:,} generated"
        )
    if len(ranked) > MAX_USERS_LISTED:
        lines.append(f"... and {len(ranked) - MAX_USERS_LISTED} more")
    prompt = sum(r.prompt_tokens for r in rows)
    cached = sum(r.cached_tokens for r in rows)
    total = _turns(
        sum(r.turns_done for r in rows),
        sum(r.turns_failed for r in rows),
        sum(r.turns_stopped for r in rows),
    )
    lines.append(
        f"Total: {total}; "
        f"{prompt:,} prompt tokens ({_share(cached, prompt)} cached), "
        f"{sum(r.completion_tokens for r in rows):,} generated"
    )
    return "\n".join(lines)


async def stats_answer(
    usage: UsageReports,
    *,
    channel: str,
    owner: str,
    user_id: str | None,
    args: str,
    is_admin: AdminCheck,
) -> str:
    """The answer to ``/stats`` (the user's day) or ``/stats all`` (everyone's, admins only).

    ``channel`` and ``owner`` are what the platform's messages are stored under,
    so the figures are exactly the user's turns there; the limit is the one the
    user's messages are admitted against (``user:<channel>:<user id>``).
    """
    if user_id is None:
        return NO_USER_TEXT
    if args.strip().lower() == "all":
        if not is_admin(user_id):
            return NOT_ADMIN_TEXT
        day, rows = await usage.today_by_user(owner=owner, channel=channel)
        return channel_stats_text(rows, day=day.isoformat())
    today = await usage.today(
        UsageQuery(owner=owner, channels=(channel,), user_id=user_id),
        subject=user_subject(channel, user_id),
    )
    return user_stats_text(today, admin=is_admin(user_id))
