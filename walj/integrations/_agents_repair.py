"""An Agents SDK Session whose history is repaired from the journal before the SDK reads it, so
a function call left without its output by a crash reaches the model with the journal's
truthful output instead of being dropped (the SDK's `drop_orphan_function_calls`)."""

from __future__ import annotations

from typing import Any

import walj

from .openai import repair_messages


class RepairedSession:
    """`session` (any Agents SDK Session) as the SDK sees it through `repaired_session`: its
    `get_items` answered by walj.integrations.openai.repair_messages over the journal;
    everything else is the session's own. Nothing is written to the session: the repair is
    made again at each read, from the journal."""

    def __init__(self, session: Any, journal: walj.ToolJournal) -> None:
        if not isinstance(journal, walj.ToolJournal):
            raise TypeError(f"journal must be a walj.ToolJournal, not {type(journal).__name__}")
        missing = [name for name in ("get_items", "add_items", "pop_item", "clear_session")
                   if not callable(getattr(session, name, None))]
        if missing or not isinstance(getattr(session, "session_id", None), str):
            raise TypeError(f"session must be an Agents SDK Session, not "
                            f"{type(session).__name__}")
        self._session = session
        self._journal = journal

    @property
    def session_id(self) -> str:
        return str(self._session.session_id)

    @property
    def session_settings(self) -> Any:
        return getattr(self._session, "session_settings", None)

    @property
    def session(self) -> Any:
        """The session repaired."""
        return self._session

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return repair_messages(await self._session.get_items(limit), self._journal)

    async def add_items(self, items: list[Any]) -> None:
        await self._session.add_items(items)

    async def pop_item(self) -> Any:
        return await self._session.pop_item()

    async def clear_session(self) -> None:
        await self._session.clear_session()


def repaired_session(session: Any, journal: walj.ToolJournal) -> RepairedSession:
    """`session` with its history repaired from `journal` whenever the SDK reads it: pass it
    as `Runner.run(..., session=repaired_session(session, journal))`. TypeError when either
    is not what it should be."""
    return RepairedSession(session, journal)
