"""No-op ClientApp: answers at once.

Message config ``mode``:
  tiny           reply with one scalar;
  payload        reply with one N-vector (as a flower-vfl party replies with s_m);
  packed         the same, its bytes in the config record (as flower_vfl.io.wire packs it);
  packed-v       packed, one N-vector received instead of two;
  payload-state  as payload, and also keep two N-vectors in ``context.state`` (as a
                 flower-vfl party keeps s_m and z_loc between rounds).
"""

import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    t_in = time.time()
    cfg = msg.content["config"]
    mode = str(cfg["mode"])
    busy = float(cfg.get("busy_s", 0.0))
    if busy > 0:                                # stand-in for a party's x-update compute
        while time.time() - t_in < busy:
            pass
    if mode == "tiny":
        return Message(RecordDict({"config": ConfigRecord({"t_in": t_in, "t_out": time.time()})}),
                       reply_to=msg)
    if mode in ("packed", "packed-v"):      # packed-v: one N-vector down (flower-vfl's v at alpha = 1)
        q = np.frombuffer(cfg["q"], dtype=np.float64)
        return Message(RecordDict({"config": ConfigRecord({"t_in": t_in, "t_out": time.time(),
                                                           "s": np.asarray(q, dtype=float).tobytes()})}),
                       reply_to=msg)
    q = msg.content["vectors"]["q"].numpy()
    if mode == "payload-state":
        if "bench" in context.state:            # read back what the last message kept
            q = q + 0.0 * context.state["bench"]["s"].numpy()
        context.state["bench"] = ArrayRecord({"s": Array(q.copy()), "z": Array(q.copy())})
    return Message(RecordDict({"release": ArrayRecord({"s": Array(np.asarray(q, dtype=float))}),
                               "config": ConfigRecord({"t_in": t_in, "t_out": time.time()})}),
                   reply_to=msg)
