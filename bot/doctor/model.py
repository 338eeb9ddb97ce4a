"""Doctor checks of the model layer: folder and tokenizer, then the in-process engine."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from bot.config import DEFAULT_DEMO_MODEL_DIR, Settings
from bot.engine.base import GenerationRequest, InferenceEngine
from bot.errors import CONFIG, BotError, DoctorFailure, ErrorClass
from bot.models.pull import DEFAULT_SMOLLM2_DIR
from bot.turns.chat_format import ChatFormat, ChatTemplateError, load_tokenizer

ENGINE_START_TIMEOUT_S = 600.0
GENERATE_TIMEOUT_S = 60.0
PROBE_TEXT = "ping"


def looks_local(name: str) -> bool:
    """A filesystem path rather than a Hugging Face id (``org/name``)."""
    path = Path(name)
    if (
        path in (DEFAULT_DEMO_MODEL_DIR, DEFAULT_SMOLLM2_DIR)
        or path.is_absolute()
        or name.startswith((".", "~"))
        or path.exists()
    ):
        return True
    first = path.parts[0] if path.parts else ""
    return len(path.parts) != 2 or Path(first).is_dir()


def check_model_folder(settings: Settings) -> str:
    """The model folder exists and holds a model (skipped for Hub ids and remote engines)."""
    model = settings.engine.model
    if settings.engine.kind != "local" or not looks_local(model):
        return f"{model} (not a local folder: checked by the tokenizer and engine layers)"
    path = Path(model).expanduser()
    if not path.is_dir():
        raise DoctorFailure(
            ErrorClass.MODEL_NOT_FOUND.value,
            f"model folder {path} does not exist",
            _missing_folder_hint(path),
        )
    if not (path / "config.json").is_file():
        raise DoctorFailure(
            ErrorClass.MODEL_NOT_FOUND.value,
            f"{path} has no config.json: not a Hugging Face model folder",
            "point engine.model at the folder that holds config.json and the weights",
        )
    return str(path)


def _missing_folder_hint(path: Path) -> str:
    """The command that writes the folder, for the folders ``botctl`` knows how to make."""
    if path == DEFAULT_SMOLLM2_DIR:
        return f"pull it once: `botctl model pull --smollm2 --path {path}` (`make run` does)"
    if path == DEFAULT_DEMO_MODEL_DIR:
        return f"build the demo model: `botctl demo-model --path {path}`"
    return (
        "set engine.model (bot.toml or BOT_ENGINE__MODEL) to a model folder, or prepare "
        "one with `botctl model pull ID`"
    )


def check_tokenizer(settings: Settings) -> tuple[str, ChatFormat]:
    """The tokenizer loads and its chat template renders a first turn."""
    name = settings.engine.tokenizer or settings.engine.model
    try:
        tokenizer = load_tokenizer(name)
    except Exception as exc:
        raise DoctorFailure(
            ErrorClass.MODEL_NOT_FOUND.value,
            f"tokenizer {name!r} does not load: {type(exc).__name__}",
            "set engine.tokenizer (or engine.model) to a local folder or a model id in the "
            "Hugging Face cache; offline hosts need a local copy",
        ) from exc
    try:
        chat_format = ChatFormat(tokenizer, settings.chat.system_prompt)
        prompt = chat_format.first_turn(PROBE_TEXT).token_ids
    except (ChatTemplateError, ValueError, TypeError) as exc:
        raise DoctorFailure(
            CONFIG,
            f"the chat template of {name!r} does not render: {exc}",
            "use a chat model (its tokenizer_config.json has a chat_template)",
        ) from exc
    return f"{name}: first prompt is {len(prompt)} tokens", chat_format


async def check_local_engine(
    settings: Settings, chat_format: ChatFormat, engine: InferenceEngine | None
) -> str:
    """Start vLLM (unless one is given, already started) and generate one token."""
    owned = engine is None
    if engine is None:
        from bot.engine.vllm_local import LocalVLLMEngine

        engine = LocalVLLMEngine(settings.engine)
    try:
        try:
            async with asyncio.timeout(ENGINE_START_TIMEOUT_S):
                await engine.start()
        except BotError as exc:
            raise DoctorFailure(exc.error_class.value, exc.message, exc.hint) from exc
        return await generate_one_token(engine, chat_format)
    finally:
        if owned:
            await engine.shutdown()


async def generate_one_token(engine: InferenceEngine, chat_format: ChatFormat) -> str:
    prompt = chat_format.first_turn(PROBE_TEXT).token_ids
    request = GenerationRequest(
        request_id=f"doctor-{uuid.uuid4().hex[:12]}",
        prompt_token_ids=prompt,
        max_tokens=1,
        temperature=0.0,
        top_p=1.0,
    )
    generated: list[int] = []
    try:
        async with asyncio.timeout(GENERATE_TIMEOUT_S):
            async for chunk in engine.generate(request):
                generated.extend(chunk.token_ids)
    except TimeoutError as exc:
        raise DoctorFailure(
            ErrorClass.TIMEOUT.value,
            f"no token within {GENERATE_TIMEOUT_S:.0f} s",
            "the engine is overloaded or stuck; check its log",
        ) from exc
    except BotError as exc:
        raise DoctorFailure(exc.error_class.value, exc.message, exc.hint) from exc
    if len(generated) != 1:
        raise DoctorFailure(
            ErrorClass.UPSTREAM_PROTOCOL.value, f"asked for 1 token, got {len(generated)}"
        )
    return f"generated 1 token from a {len(prompt)}-token prompt"
