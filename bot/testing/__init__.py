"""Test support shared by the test suite and the benchmarks; the service never imports it.

* ``telegram_api`` / ``slack_api``: strict fakes of the platforms' Bot and Web APIs,
  served on loopback, stricter than the platforms (``telegram_html`` checks the HTML a
  message carries the way Telegram parses it);
* ``discord_api`` / ``discord_gateway``: a strict fake of Discord's HTTP API and a fake
  gateway (a real WebSocket server speaking Discord's gateway protocol), on loopback;
* ``vllm_servers``: real vLLM OpenAI servers on loopback, each pinned to a CPU.
"""
