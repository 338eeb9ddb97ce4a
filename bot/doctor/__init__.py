"""``botctl doctor``: walk the layers a message passes and stop at the first that fails.

Layers, top to bottom: config, database, migrations, model (folder and
tokenizer), engine (the local vLLM starts and generates a token, or every
remote server answers the OpenAI API; a router in front is named with the
replicas it reports, ``bot.doctor.router``), then each configured table of a
channel kind with a ``doctor.py`` (``bot.doctor.walk._checks``). Each check
reports its layer, ok/fail, time, an error class and a one-line hint for the
usual causes.
"""

from bot.doctor.report import CheckResult, render_report, render_text
from bot.doctor.walk import run_doctor

__all__ = ["CheckResult", "render_report", "render_text", "run_doctor"]
