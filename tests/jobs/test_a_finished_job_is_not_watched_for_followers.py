"""A finished job's follower watch stays closed (``X-KCoral-Cancel-Unfollowed``, EXTENSIONS
§5): ``kcoral run`` reads its job's stream to the end, and that stream closes after the job
has finished; its end armed the watch again, so every such job was logged ``job_unfollowed``
(a WARNING that it was cancelled) a minute after it had completed."""

from __future__ import annotations

import asyncio

from kcoral_server.jobs.followers import FollowerWatch


def test_the_stream_that_read_a_finished_jobs_end_does_not_arm_its_watch() -> None:
    cancelled: list[bool] = []

    async def follow_to_the_end() -> FollowerWatch:
        watch = FollowerWatch(60, lambda: cancelled.append(True))
        watch.follower_came()  # kcoral run opens the stream
        watch.close()  # the job finished
        watch.follower_left()  # the stream ends after the finished phase
        return watch

    watch = asyncio.run(follow_to_the_end())
    assert not watch.armed and not watch.fired and not cancelled


def test_a_running_jobs_last_follower_leaving_arms_its_watch() -> None:
    async def leave() -> bool:
        watch = FollowerWatch(60, lambda: None)
        watch.follower_came()
        watch.follower_left()
        armed = watch.armed
        watch.close()
        return armed and not watch.armed

    assert asyncio.run(leave())
