"""A job's phase event never overtakes the output written before it (EXTENSIONS §5).

The server tails a program's capture files and lets at most one chunk per stream leave per
50 ms; phase events left at once. So a line written just before a program's next
instruction came after that instruction's phase: in a terminal, ``%%kcoral`` printed
``kcoral: returning the results`` and then the cell's last line.
"""

from __future__ import annotations

from job_helpers import module_program

import kcoral

#: Three lines in quick succession, then the next instruction (the return) at once: the
#: second and third land within the 50 ms after the first one's chunk left.
WRITES_THEN_RETURNS = """
import time
def f():
    print("one", flush=True)
    time.sleep(0.03)
    print("two", flush=True)
    print("three", flush=True)
    return 1
"""


def test_the_output_written_before_an_instruction_arrives_before_its_phase(
    kcoral_server,
) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        for _ in range(3):
            job = client.submit(module_program(WRITES_THEN_RETURNS, "f"))
            seen = list(job.events())
            returning = next(
                index
                for index, event in enumerate(seen)
                if event.kind == "phase" and event.data.get("op") == "return"
            )
            before = "".join(event.text for event in seen[:returning] if event.kind == "stdout")
            assert before == "one\ntwo\nthree\n", [(e.kind, e.data) for e in seen]


#: An instruction that writes at once: its line is in the capture file before the server has
#: read the worker's frame saying the instruction started.
WRITES_AT_ONCE = """
import time
def f():
    print("from the run", flush=True)
    time.sleep(0.05)
    return 1
"""


def test_an_instructions_output_arrives_after_its_phase(kcoral_server) -> None:
    # Before, the server caught up on everything the files held when it read an instruction's
    # frame, by then often the instruction's own first lines too: 'from the run' came before
    # the get_function and run phases (5 of 10 jobs on a CPU server).
    with kcoral.Client(kcoral_server.url) as client:
        for _ in range(10):
            job = client.submit(module_program(WRITES_AT_ONCE, "f"))
            seen = [(event.kind, event.data) for event in job.events()]
            output = next(index for index, (kind, _) in enumerate(seen) if kind == "stdout")
            run = next(index for index, (_, data) in enumerate(seen) if data.get("op") == "run")
            assert run < output, seen
