"""Models the service can serve, prepared before ``botctl serve`` starts.

``botctl model pull`` writes a complete Hugging Face model folder under
``data/`` once (``bot.models.pull``), so that ``serve`` never downloads or
converts anything inside a start-up timeout. ``botctl demo-model`` builds the tiny
offline model the tests serve (``bot.models.demo_model``).
"""
