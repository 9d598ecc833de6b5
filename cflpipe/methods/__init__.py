"""The built-in methods: `catalog` declares each one once (hyper-parameters, family, capabilities,
variants, premises) and names the class that implements it, in a module of this package imported
when a run needs it. The registry itself is `cflpipe.registry`; a plugin's method registers with
`@cflpipe.methods.register(NAME, PARAMS)`, re-exported here with what a plugin's class needs."""

from cflpipe.registry import Capabilities, HyperParams, all_methods, method_info, method_names, register

__all__ = ["Capabilities", "HyperParams", "all_methods", "method_info", "method_names", "register"]
