"""What the operator commands do, without the command line: keys, conversations.

``bot.cli`` parses arguments and prints; the logic lives here, testable on its own.
"""
