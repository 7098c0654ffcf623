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


def test_a_job_that_finished_before_its_watch_was_set_is_never_watched() -> None:
    from kcoral_server.jobs.store import Job, JobRegistry

    said: list[str] = []

    async def finished_first() -> Job:
        jobs = JobRegistry(60, 1 << 20, emit=lambda event, *a, **k: said.append(event))
        job = Job("request-1", {}, "alice")
        job.status = "COMPLETED"  # its program ended as its 202 was being written
        jobs.cancel_when_unfollowed(job, 60)
        return job

    job = asyncio.run(finished_first())
    assert job.follow_watch is None and said == []
