"""``VerticalPartyClient``: the vertical party a ClientApp builds, public or private.

``VerticalPartyClient(party_id, D, D_test, ..., privacy=None | PrivacyConfig, ...)`` returns a
:class:`~flower_vfl.clients.party_public.PublicPartyClient` (exact releases) or a
:class:`~flower_vfl.clients.party_private.PrivatePartyClient` (noisy releases charged in the
party's ledger). Both share the trust boundary and the reply of
:class:`~flower_vfl.clients.party_base.PartyClient`, and both are instances of
``VerticalPartyClient``. Parameters: :class:`~flower_vfl.clients.party_base.PartyClient`.
"""

from __future__ import annotations

import abc

from flower_vfl.clients.party_base import PartyClient
from flower_vfl.clients.party_private import PrivatePartyClient, party_store
from flower_vfl.clients.party_public import PublicPartyClient

__all__ = ["PartyClient", "PrivatePartyClient", "PublicPartyClient", "VerticalPartyClient", "party_store"]

#: the position of ``privacy`` in PartyClient's parameters (after party_id, D, D_test, penalty,
#: lam, constraint, l1_ratio)
_PRIVACY_ARG = 7


class VerticalPartyClient(abc.ABC):
    """Party m of vertical ADMM sharing, usable from any Flower ``ClientApp``: builds a
    :class:`PrivatePartyClient` when ``privacy`` is given, else a :class:`PublicPartyClient`."""

    def __new__(cls, *args, **kwargs):
        privacy = args[_PRIVACY_ARG] if len(args) > _PRIVACY_ARG else kwargs.get("privacy")
        return (PublicPartyClient if privacy is None else PrivatePartyClient)(*args, **kwargs)


VerticalPartyClient.register(PublicPartyClient)
VerticalPartyClient.register(PrivatePartyClient)
