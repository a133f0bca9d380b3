"""faust processors over the facts topic: the reconciler, the resumer, analytics.

`DEFAULT_SESSION_TIMEOUT_S` lives here, not beside the faust app, so the commands can show it
as their default without importing faust (`toolledger --help` must stay light).
"""

#: The consumer groups' session timeout: as short as Apache Kafka accepts by default
#: (`group.min.session.timeout.ms`, 6 s), so a SIGKILLed member's partitions move soon. It was
#: 3 s, fitted to tansu: a default Apache Kafka refused every processor's join with
#: InvalidSessionTimeoutError and the processors sat idle, as the suite found once it ran there.
DEFAULT_SESSION_TIMEOUT_S = 6.0
