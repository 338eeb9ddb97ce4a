"""The platform fakes of the channel tests, for tests that drive every channel at once."""

from tests.slack.conftest import slack_api
from tests.telegram.conftest import fake_telegram
from tests.webhook.conftest import receiver

__all__ = ["fake_telegram", "receiver", "slack_api"]
