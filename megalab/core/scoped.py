"""A memo that holds only inside a `with` block: for a reader of something nothing changes while it reads (a page
build reading the checkout's git history and committed records), so that a question asked again inside the block
gets the first answer, and nothing is remembered outside it. Blocks nest: the outermost one owns the memo."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class Scoped:
    def __init__(self) -> None:
        self.memo: dict[Any, Any] | None = None  # None outside every block

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        outer = self.memo
        if outer is None:
            self.memo = {}
        try:
            yield
        finally:
            if outer is None:
                self.memo = None
