"""The engines' entry points into attnhal's plugins, outside the ``attnhal`` package so that an
engine loading its plugins imports nothing of attnhal until the plugin is needed
(``import attnhal`` is about 0.1 s). :mod:`attnhal_hooks.sglang`: SGLang's general plugin."""
