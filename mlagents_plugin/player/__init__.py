"""A headless player that speaks the Unity build's side of ML-Agents' protocol.

``python -m mlagents_plugin.player make-build DIR --scene goal`` writes ``DIR/goal.x86_64``;
``mlagents-learn config.yaml --env=DIR/goal`` then launches it as it launches a Unity build, over
real gRPC, with the flags, handshake, side channels and episode semantics of a Unity player.
See docs/player.md.
"""
