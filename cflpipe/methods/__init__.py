"""The built-in methods: each is declared once, torch-free, in the `X_params.py` beside the module `X.py` that implements it
(hyper-parameters, family, capabilities, variants, premises, the class's name); `catalog` imports
every declaration, and a method's module is imported when a run needs it. The registry itself is `cflpipe.registry`; a plugin's method registers with
`@cflpipe.methods.register(NAME, PARAMS)`, re-exported here with what a plugin's class needs."""

from cflpipe.registry import Capabilities, HyperParams, all_methods, method_info, method_names, register

__all__ = ["Capabilities", "HyperParams", "all_methods", "method_info", "method_names", "register"]
