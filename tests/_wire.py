"""What a spy on the in-process grid sees, decoded: a request's or reply's arrays packed into a
config record (flower_vfl.io.wire) back in their ArrayRecords, so tests read what travelled."""

from flower_vfl.io.wire import PACK_REPLY_INTO, PACK_REQUEST_INTO, is_packed, pack, unpack


def travelled(content):
    """``content`` (a request or a reply) with its packed arrays unpacked; unchanged when none."""
    for into in (PACK_REQUEST_INTO, PACK_REPLY_INTO):
        content = unpack(content, into, AssertionError, "the message")
    return content


def edit_reply(rep, edit):
    """``edit(content)`` on a reply as it was sent, decoded (a faulty party's reply); packed again
    when it travelled packed, so the central node reads the edited values where it reads them."""
    was = is_packed(rep.content, PACK_REPLY_INTO)
    content = travelled(rep.content)
    edit(content)
    rep.content = pack(content, PACK_REPLY_INTO) if was else content
    return rep
