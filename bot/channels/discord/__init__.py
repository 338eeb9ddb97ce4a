"""Discord: slash commands over the interactions endpoint, mentions and DMs over the gateway."""
