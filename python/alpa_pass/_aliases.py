"""Keyword aliases of frozen dataclasses: Alpa's names of our fields (``devices=`` for ``mesh``,
``auto_sharding_option=`` for ``option``, ...), taken by ``__init__`` and read back as properties.

They are not dataclass fields, so ``dataclasses.replace(obj, field=X)`` (which passes every field
again) does not also pass the old value under the alias and trip the "both names given" check.
"""
from __future__ import annotations

import functools
import inspect


def keyword_aliases(**aliases):
    """Class decorator, above ``@dataclasses.dataclass``: ``alias=(field, convert)`` makes
    ``cls(alias=v)`` mean ``cls(field=convert(v, cls_name))`` and ``obj.alias`` read ``obj.field``.
    ``convert`` may be None (the value as given). TypeError when a field and its alias are both
    given, with different values. A subclass that is a dataclass of its own gets a new
    ``__init__``: decorate it too."""
    def install(cls):
        init = cls.__init__
        signature = inspect.signature(init)

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            given = {a: v for a in aliases if (v := kwargs.pop(a, None)) is not None}
            if given:
                bound = signature.bind_partial(self, *args, **kwargs).arguments
                bound.pop("self")
                for alias, value in given.items():
                    field, convert = aliases[alias]
                    value = value if convert is None else convert(value, cls.__name__)
                    if bound.get(field) is not None and bound[field] != value:
                        raise TypeError(f"{cls.__name__}: give {field}= or {alias}= (Alpa's name of it), not both")
                    bound[field] = value
                args, kwargs = (), bound
            init(self, *args, **kwargs)

        extra = [inspect.Parameter(a, inspect.Parameter.KEYWORD_ONLY, default=None) for a in aliases]
        __init__.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *extra])
        cls.__init__ = __init__
        for alias, (field, _) in aliases.items():
            setattr(cls, alias, property(lambda self, f=field: getattr(self, f), doc=f"Alpa's name of ``{field}``."))
        return cls
    return install
