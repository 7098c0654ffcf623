"""How much of ``GET /v1/jobs`` one answer holds (EXTENSIONS §5), on a server and a router.

The list was every retained job of the caller: with many of them (``--job-retention-bytes``
keeps about 300,000 small ones) one answer grew to hundreds of MiB, and a router left out,
without a word, a node whose list passed the 64 MiB it fetches. Now an answer holds the
newest ``?limit=N`` jobs (default ``DEFAULT_LISTED``, at most ``MOST_LISTED``: about 7 MB),
and says how many it left out in ``LEFT_OUT_HEADER``; a router also names the nodes whose
list it could not read in ``NODES_LEFT_OUT_HEADER``. The body stays a JSON array, so
clients of the published protocol read it as before.
"""

from __future__ import annotations

DEFAULT_LISTED = 1000
MOST_LISTED = 10000
#: the caller's jobs newer ones pushed out of this answer (``0``: the list is whole)
LEFT_OUT_HEADER = "X-KCoral-Jobs-Left-Out"
#: a router's: the nodes (comma-separated ids) whose list it could not read (none: absent)
NODES_LEFT_OUT_HEADER = "X-KCoral-Nodes-Left-Out"
LIMIT_PROBLEM = f"limit must be an integer from 1 to {MOST_LISTED}"


def listing_limit(text: str | None) -> int | None:
    """The jobs one answer may list for ``?limit=`` ``text`` (absent: the default; above
    the most: the most), or None when it is not a whole number of at least 1 (``400``)."""
    if text is None:
        return DEFAULT_LISTED
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        return None
    if len(text) > len(str(MOST_LISTED)):  # int() of a long text costs; it is over anyway
        return MOST_LISTED
    value = int(text)
    return min(value, MOST_LISTED) if value >= 1 else None


def left_out_count(text: str | None) -> int:
    """A node's ``LEFT_OUT_HEADER`` (a node-token holder wrote it): a whole number up to
    10⁹, else 0."""
    if text is None:
        return 0
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        return 0
    return int(text)
