"""A training recipe over LeRobot 0.6 language columns, rendered per sample by LeRobot's own
``render_messages_processor`` (``RenderMessagesStep``), as the tests in this folder render it.
LeRobot 0.6.1's trainer applies no recipe itself: a sample is rendered before it is collated (here
by ``render``), and ``lerobot_collate_fn`` then keeps the messages as lists. Imported only where
LeRobot is importable."""

from __future__ import annotations

import functools
from typing import Any

from lerobot.configs.recipe import MessageTurn, TrainingRecipe
from lerobot.lerobot_types import TransitionKey
from lerobot.processor.render_messages_processor import RenderMessagesStep


@functools.cache
def recipe() -> TrainingRecipe:
    """A blend of two recipes (picked per sample by its index), each with a target in every sample
    (the plan, or the subtask), and turns where the sample has them: interjections and the ``say``
    tool's calls (``tool_calls`` dicts in the messages)."""
    high = TrainingRecipe(weight=1.0, messages=[
        MessageTurn(role="user", content="${task}", stream="high_level"),
        MessageTurn(role="user", content="${interjection}", stream="high_level", if_present="interjection"),
        MessageTurn(role="assistant", content="${plan}", stream="high_level", target=True),
        MessageTurn(role="assistant", tool_calls_from="speech", stream="high_level", target=True,
                    if_present="speech")])
    low = TrainingRecipe(weight=1.0, messages=[
        MessageTurn(role="user", content="${task}: ${memory}", stream="low_level"),
        MessageTurn(role="user", content="${interjection}", stream="low_level", if_present="interjection"),
        MessageTurn(role="assistant", content="${subtask}", stream="low_level", target=True),
        MessageTurn(role="assistant", tool_calls_from="speech", stream="low_level", target=True,
                    if_present="speech")])
    return TrainingRecipe(blend={"high": high, "low": low})


@functools.cache
def _step() -> RenderMessagesStep:
    return RenderMessagesStep(recipe=recipe())


def render(sample: dict[str, Any]) -> dict[str, Any] | None:
    """``sample`` after LeRobot's RenderMessagesStep: the language columns replaced by ``messages``,
    ``message_streams`` and ``target_message_indices`` (None when the recipe has no target)."""
    transition = _step()({TransitionKey.COMPLEMENTARY_DATA: sample})
    return None if transition is None else transition[TransitionKey.COMPLEMENTARY_DATA]
