"""All-reduce across every GPU of a server with NCCL, in one `gpu_count` program.

Needs a `kcoral server --device gpu` with at least 2 GPUs (and torch built with NCCL).
KCoral runs the program once, in a fresh interpreter that sees the k granted GPUs as
logical devices 0…k-1; it starts no ranks and no process group, so the program does that
itself: here one thread per GPU joins a `torch.distributed` NCCL group over an in-process
store and all-reduces a tensor.

Run: python examples/nccl_allreduce.py --url http://HOST:PORT [--gpus N]
     (the server's token, if it needs one: KCORAL_TOKEN)
"""

from __future__ import annotations

import argparse
import sys

import kcoral
from kcoral.connection.server_address import server_url

SOURCE = """
import threading

import torch
import torch.distributed as dist


def all_reduce(size):
    world = torch.cuda.device_count()
    if world < 2:
        raise RuntimeError(f"needs at least 2 GPUs, this program sees {world}")
    store = dist.HashStore()  # the ranks are threads of this one process
    results = [None] * world
    errors = []

    def rank_main(rank):
        try:
            torch.cuda.set_device(rank)
            group = dist.ProcessGroupNCCL(dist.PrefixStore("kcoral", store), rank, world)
            x = torch.full((size,), float(rank + 1), device=f"cuda:{rank}")
            group.allreduce([x]).wait()
            torch.cuda.synchronize(rank)
            results[rank] = x[:4].tolist()
        except BaseException as exc:  # reported below, after every thread has finished
            errors.append(f"rank {rank}: {exc!r}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    expected = world * (world + 1) / 2
    assert all(r == [expected] * 4 for r in results), results
    return {"world_size": world, "sum": expected, "devices": [
        torch.cuda.get_device_name(r) for r in range(world)]}
"""


NEEDS = "this example needs a GPU server with at least 2 GPUs"


def build_program(size: int = 1 << 20) -> kcoral.Program:
    """The all-reduce program; `size` elements of float32 per GPU."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=SOURCE)
    all_reduce = program.get_function(module=module, name="all_reduce")
    program.return_(key="report", value=program.run(fn=all_reduce, args=[size]))
    return program


def server_address(text: str) -> str:
    """``--url`` by the client's address rule, refused by argparse in its words."""
    try:
        return server_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", type=server_address, required=True, help="a GPU server with at least 2 GPUs"
    )
    parser.add_argument("--gpus", type=int, default=None, help="GPU count (default: all)")
    args = parser.parse_args(argv)
    try:
        client = kcoral.Client(args.url)  # its token, if it needs one: KCORAL_TOKEN
    except ValueError as error:  # a KCORAL_TOKEN it cannot send: one line, no traceback
        print(error, file=sys.stderr)
        return 1
    try:
        with client:
            info = client.info()
            if info.get("device") == "cpu":  # a router's: its default kind, where this goes
                # Its 400 for a gpu_count would say "exceeds this GPU server's configured
                # capacity" (PROTOCOL §7's fixed words), as if it had GPUs, too few.
                print(f"{args.url} runs programs on the CPU and has no GPUs; {NEEDS}",
                      file=sys.stderr)  # fmt: skip
                return 2
            health = client.health()
            count = args.gpus if args.gpus is not None else int(health["gpu_count"] or 0)
            if count < 2:
                print(f"the server has {count} GPU(s); {NEEDS}", file=sys.stderr)
                return 2
            result = client.execute(build_program(), gpu_count=count, timeout_seconds=300)
    except kcoral.TransportError as error:  # one line, not the client's traceback
        print(error, file=sys.stderr)
        return 1
    except kcoral.KCoralError as error:
        # a 401 names the server and where a token comes from
        print(error if error.status_code == 401 else f"{args.url} answered {error}",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"status {result.status} on GPUs {list(result.gpu_ids)}")
    if result.status != "COMPLETED":
        print(result.error, file=sys.stderr)
        return 1
    print(result.results["report"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
