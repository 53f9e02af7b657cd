"""Configuration: one schema owning every run-, node- and CLI key (``schema``), and the
helpers that read a setting from the run and node configs (``settings``)."""
