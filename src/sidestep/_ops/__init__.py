"""The operator's tools: the `sidestep` command and its launcher, the doctor, the admin
app's internals and its page, and the demo."""
