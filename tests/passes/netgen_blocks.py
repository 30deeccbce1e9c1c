"""The random nets' structure: ``NetGenerator`` builds one net from blocks (a few layers that
form one structure: conv + BN + ReLU, residual sums, parallel branches, slices, recurrent and
attention layers...) on a data input, then one or two heads (a train loss each, Accuracy for test,
an infer output), and writes its YAML text."""
from __future__ import annotations

import math

import yaml
from netgen_bounds import INF, product_bounds
from netgen_layers import LOG_MIN_INPUT, MAX_CHANNELS, GeneratedNet, LayerWriter


class NetGenerator(LayerWriter):
    """Builds one net: a trunk of random blocks on a data input, then one or two heads (a
    train loss each, with Accuracy for test and an infer output). Blocks and heads are methods;
    each reads blobs by name, so an in-place layer's effect is seen by everything below it."""

    def block(self, x: str) -> str:
        rank = self.blobs[x].rank
        if rank == 4:
            table = [(self.conv_bn_relu, 5), (self.conv_pool, 4), (self.pool_block, 2),
                     (self.activation_chain, 3), (self.residual, 4), (self.parallel, 4),
                     (self.slice_concat, 2), (self.duplicate, 2), (self.positive_log, 2),
                     (self.dropout_block, 1), (self.reshape_roundtrip, 1), (self.phase_inplace, 2),
                     (self.gate, 1), (self.to_rank3, 3), (self.to_rank2, 2)]
            if "Scale" in self.types:
                table += [(self.bn_scale, 2), (self.squeeze_excite, 2)]
            if self.blobs[x].shape[2] * self.blobs[x].shape[3] <= 4:   # small already: flatten soon
                table.append((self.to_rank2, 6))
        elif rank == 3:
            table = [(self.activation_chain, 2), (self.ip_axis2, 3), (self.seq_softmax, 1),
                     (self.dropout_block, 1), (self.to_rank2, 3), (self.batch_norm, 1),
                     (self.recurrent, 3), (self.layer_norm, 1), (self.attention, 2), (self.permute_time, 1)]
        else:
            table = [(self.ip_block, 5), (self.activation_chain, 3), (self.residual, 3), (self.parallel, 4),
                     (self.slice_concat, 2), (self.duplicate, 2), (self.positive_log, 2),
                     (self.dropout_block, 1), (self.phase_inplace, 2), (self.gate, 1), (self.to_rank4, 1)]
            if "Scale" in self.types:
                table.append((self.scale, 1))
        blocks, weights = zip(*table)
        return self.rng.choices(blocks, weights)[0](x)

    def conv_bn_relu(self, x: str) -> str:
        h = self.conv(x)
        if self.chance(0.6):
            h = self.batch_norm(h)
        if self.chance(0.7):
            h = self.activation(h, "ReLU", inplace_p=0.8)
        return h

    def conv_pool(self, x: str) -> str:
        h = self.conv(x)
        if self.chance(0.3):           # a monotone activation between conv and max pooling
            h = self.activation(h, self.rng.choice(["ReLU", "TanH", "Sigmoid"]), inplace_p=0.7)
        if min(self.blobs[h].shape[2:]) < 2:
            return h
        return self.pooling(h, "max", plain=self.chance(0.7))

    def pool_block(self, x: str) -> str:
        return self.pooling(x)

    def activation_chain(self, x: str) -> str:
        for _ in range(self.rng.randint(1, 4)):
            x = self.activation(x)
        return x

    def positive_log(self, x: str) -> str:
        """Log of something bounded away from 0: Exp / Sigmoid / Softplus of a TanH, or |x| plus
        Exp of a TanH, or a Softmax of a TanH."""
        recipe = self.rng.choice(["exp", "sigmoid", "softplus", "abs_plus", "softmax"])
        t = self.activation(x, "TanH", inplace_p=0.3)
        if recipe == "abs_plus":
            a = self.activation(x, "AbsVal", inplace_p=0.0)
            e = self.activation(t, "Exp", inplace_p=0.0)
            p = self.eltwise([a, e], "sum")
        elif recipe == "softmax" and self.blobs[t].shape[1] >= 2:
            p = self.softmax(t, 1)
        else:
            kind = {"exp": "Exp", "sigmoid": "Sigmoid", "softplus": "Softplus"}.get(recipe, "Exp")
            p = self.activation(t, kind, inplace_p=0.5)
        if self.blobs[p].lo < LOG_MIN_INPUT:       # an Eltwise coeff may have spoiled the floor
            return p
        return self.activation(p, "Log", inplace_p=0.5)

    def residual(self, x: str) -> str:
        """y = x + branch(x) (Eltwise sum, sometimes weighted), then maybe an in-place ReLU."""
        b = self.blobs[x]
        if b.rank == 4:
            h = self.conv(x, b.shape[1], same_size=True)
            if self.chance(0.5):
                h = self.batch_norm(h)
            h = self.activation(h, "ReLU" if self.chance(0.6) else None)
            if self.chance(0.4):
                h = self.conv(h, b.shape[1], same_size=True)
        else:
            h = self.inner_product(x, b.shape[1])
            h = self.activation(h, "ReLU" if self.chance(0.6) else None)
        if self.chance(0.15):           # the trunk changes in place after the fork (Caffe order)
            self.activation(x, "ReLU", inplace_p=1.0)
        pair = [x, h] if self.chance(0.7) else [h, x]
        y = self.eltwise(pair, "sum")
        if self.chance(0.6):
            y = self.activation(y, "ReLU", inplace_p=0.8)
        return y

    def parallel(self, x: str) -> str:
        """Several Convolutions / InnerProducts reading one bottom, joined by Concat or Eltwise."""
        b = self.blobs[x]
        n = self.rng.randint(2, 3)
        join = self.rng.choice(["concat", "concat", "eltwise"])
        width = self.rng.randint(1, MAX_CHANNELS)
        branches = []
        for _ in range(n):
            out = width if join == "eltwise" or self.chance(0.3) else None
            if b.rank == 4:
                h = self.conv(x, out, same_size=True)
            else:
                h = self.inner_product(x, out)
            if self.chance(0.4):
                h = self.activation(h)
            branches.append(h)
        if join == "concat":
            return self.concat(branches)
        return self.eltwise(branches)

    def slice_concat(self, x: str) -> str:
        """Slice into pieces, treat some differently, join them again (or drop one: dead code)."""
        b = self.blobs[x]
        axes = [a for a in range(1, b.rank) if b.shape[a] >= 2]
        if not axes:
            return self.activation(x)
        axis = self.rng.choice(axes)
        pieces = min(self.rng.randint(2, 3), b.shape[axis])
        parts = self.slice(x, axis, pieces)
        parts = [self.activation(p) if self.chance(0.4) else p for p in parts]
        if len(parts) > 2 and self.chance(0.3):
            parts = parts[:-1]                    # the last piece is never read
        if self.chance(0.3):
            self.rng.shuffle(parts)
        shapes = {self.blobs[p].shape for p in parts}
        if len(shapes) == 1 and self.chance(0.4):
            return self.eltwise(parts)
        return self.concat(parts, axis)

    def duplicate(self, x: str) -> str:
        """The same computation twice on one bottom (what common-subexpression elimination
        merges), the results combined."""
        kind = self.rng.choice(["activation", "softmax", "pool"])
        b = self.blobs[x]
        if kind == "softmax" and b.shape[1] >= 2:
            a, c = self.softmax(x), self.softmax(x)
        elif kind == "pool" and b.rank == 4 and min(b.shape[2:]) >= 2:
            a = self.pooling(x, "max", plain=True)
            twin = dict(self.layers[-1])
            twin["name"] = twin["top"] = self.fresh("pool")
            self.layers.append(twin)
            c = self.set_blob(twin["top"], self.blobs[a].shape, self.blobs[a].lo, self.blobs[a].hi)
        else:
            a = self.activation(x, "TanH" if self.chance(0.5) else "Sigmoid", inplace_p=0.0)
            kind = self.layers[-1]["type"]
            c = self.activation(x, kind, inplace_p=0.0)
        return self.eltwise([a, c])

    def dropout_block(self, x: str) -> str:
        return self.dropout(x)

    def phase_inplace(self, x: str) -> str:
        """An in-place layer that runs only in some phases: later layers see a different blob
        in each phase."""
        phase = self.rng.choice([["train"], ["test", "infer"], ["infer"], ["train", "test"]])
        kind = self.rng.choice(["ReLU", "TanH", "Sigmoid", "AbsVal"])
        return self.activation(x, kind, phase=phase if len(phase) > 1 or self.chance(0.5) else phase[0])

    def gate(self, x: str) -> str:
        """x times a Sigmoid of a branch: Eltwise prod, or a two-bottom Scale where it exists."""
        b = self.blobs[x]
        if b.rank == 4:
            g = self.conv(x, b.shape[1], same_size=True)
        else:
            g = self.inner_product(x, b.shape[1])
        g = self.activation(g, "Sigmoid", inplace_p=0.7)
        if "Scale" in self.types and self.chance(0.5):
            top = self.fresh("gated")
            self.add("Scale", [x, g], top, "scale", axis=0)
            lo, hi = product_bounds([(b.lo, b.hi), (self.blobs[g].lo, self.blobs[g].hi)])
            return self.set_blob(top, b.shape, lo, hi)
        return self.eltwise([x, g] if self.chance(0.5) else [g, x], "prod")

    def bn_scale(self, x: str) -> str:
        """Caffe's BatchNorm (affine false) + Scale (bias_term true), maybe + ReLU."""
        before = len(self.layers)
        h = self.batch_norm(x)
        self.layers[before]["affine"] = False
        for key in ("lr_mult", "decay_mult"):
            self.layers[before].pop(key, None)
        h = self.scale(h)
        if self.chance(0.5):
            h = self.activation(h, "ReLU", inplace_p=0.8)
        return h

    def squeeze_excite(self, x: str) -> str:
        """Global average pool -> InnerProduct -> ReLU -> InnerProduct -> Sigmoid, scaling x per
        channel through a two-bottom Scale over axes [0, 2) (its shape is [N, C])."""
        b = self.blobs[x]
        c = b.shape[1]
        top = self.fresh("pool")
        self.add("Pooling", x, top, "pool", pool="ave", global_pooling=True)
        self.set_blob(top, ("N", c, 1, 1), b.lo, b.hi)
        s = self.inner_product(top, self.rng.randint(1, 4), allow_share=False)
        s = self.activation(s, "ReLU", inplace_p=0.8)
        s = self.inner_product(s, c, allow_share=False)
        s = self.activation(s, "Sigmoid", inplace_p=0.8)
        out = self.fresh("se")
        self.add("Scale", [x, s], out, "scale", axis=0)
        lo, hi = product_bounds([(b.lo, b.hi), (self.blobs[s].lo, self.blobs[s].hi)])
        return self.set_blob(out, b.shape, lo, hi)

    def reshape_roundtrip(self, x: str) -> str:
        """Reshape to [N, C*H*W] (or [N, C, H*W]) and back: a pair a simplifier can remove."""
        b = self.blobs[x]
        _, c, h, w = b.shape
        if self.chance(0.5):
            flat = self.reshape(x, [0, -1], ("N", c * h * w))
        else:
            flat = self.flatten(x, 2) if self.chance(0.5) else self.reshape(x, [0, c, -1], ("N", c, h * w))
        if self.chance(0.4):
            flat = self.activation(flat)
        return self.reshape(flat, [0, c, h, w] if self.chance(0.5) else [-1, c, h, w], b.shape)

    def to_rank3(self, x: str) -> str:
        b = self.blobs[x]
        _, c, h, w = b.shape
        choice = self.rng.choice(["spatial", "channels", "reshape"])
        if choice == "spatial":
            return self.flatten(x, 2)                      # [N, C, H*W]
        if choice == "channels":
            return self.flatten(x, 1, 2)                   # [N, C*H, W]
        return self.reshape(x, [0, c, h * w], ("N", c, h * w))

    def to_rank2(self, x: str) -> str:
        b = self.blobs[x]
        features = math.prod(b.shape[1:])
        choice = self.rng.choice(["flatten", "reshape", "reshape_n", "ip", "ip"])
        if choice == "flatten":
            return self.flatten(x)
        if choice == "reshape":
            return self.reshape(x, [0, -1], ("N", features))
        if choice == "reshape_n":
            return self.reshape(x, [-1, features], ("N", features))
        return self.ip_block(x)

    def to_rank4(self, x: str) -> str:
        """InnerProduct to C*H*W features, reshaped to [N, C, H, W]."""
        c, h, w = self.rng.randint(1, 4), self.rng.randint(2, 5), self.rng.randint(2, 5)
        y = self.inner_product(x, c * h * w, allow_share=False)
        return self.reshape(y, [0, c, h, w] if self.chance(0.6) else [-1, c, h, w], ("N", c, h, w))

    def ip_block(self, x: str) -> str:
        h = self.inner_product(x)
        if self.chance(0.3):
            h = self.batch_norm(h)
        if self.chance(0.7):
            h = self.activation(h)
        return h

    def ip_axis2(self, x: str) -> str:
        h = self.inner_product(x, axis=self.rng.choice([2, -1]))
        if self.chance(0.5):
            h = self.activation(h)
        return h

    def recurrent(self, x: str) -> str:
        """RNN, LSTM or GRU over axis 1 as time, as a loop or unrolled; the whole sequence, or
        (then rank 2) its last step."""
        kind = self.rng.choice(["RNN", "LSTM", "GRU"])
        params = {"num_output": self.rng.randint(1, 4)}
        if self.chance(0.3):
            params["num_layers"] = 2
        if self.chance(0.4):
            params["bidirectional"] = True
        if self.chance(0.5):
            params["unroll"] = self.chance(0.5)
        relu = kind == "RNN" and self.chance(0.4)
        if relu:
            params["nonlinearity"] = "relu"
        sequence = self.chance(0.7)
        if not sequence:
            params["return_sequence"] = False
        top = self.fresh(kind.lower())
        self.add(kind, x, top, kind.lower(), **params)
        width = params["num_output"] * (2 if params.get("bidirectional") else 1)
        shape = ("N", self.blobs[x].shape[1], width) if sequence else ("N", width)
        return self.set_blob(top, shape, 0.0 if relu else -1.0, INF if relu else 1.0)

    def layer_norm(self, x: str) -> str:
        params = {} if self.chance(0.7) else {"affine": False}
        if self.chance(0.3):
            params["axis"] = 1                     # the last two axes
        top = self.top_for(x, "ln", 0.4)
        self.add("LayerNorm", x, top, "ln", **params)
        return self.set_blob(top, self.blobs[x].shape)

    def attention(self, x: str) -> str:
        """Self-attention over axis 1 (heads dividing the features), maybe causal."""
        b = self.blobs[x]
        width = b.shape[2]
        heads = self.rng.choice([h for h in (1, 2, 3) if width % h == 0])
        params = {"num_heads": heads}
        if self.chance(0.4):
            params["causal"] = True
        if self.chance(0.2):
            params["bias_term"] = False
        top = self.fresh("att")
        self.add("MultiHeadAttention", x, top, "att", **params)
        return self.set_blob(top, b.shape)

    def permute_time(self, x: str) -> str:
        b = self.blobs[x]
        top = self.fresh("perm")
        self.add("Permute", x, top, "perm", order=[0, 2, 1])
        return self.set_blob(top, ("N", b.shape[2], b.shape[1]), b.lo, b.hi)

    def seq_softmax(self, x: str) -> str:
        if self.blobs[x].shape[2] < 2:
            return self.activation(x)
        return self.softmax(x, self.rng.choice([2, -1]), log=self.chance(0.3))

    def phase_list(self, options: list) -> str | list[str]:
        phase = self.rng.choice(options)
        return phase[0] if len(phase) == 1 and self.chance(0.6) else phase

    # -- heads: losses (train), Accuracy (test), outputs (infer) ----------------------------------
    def label_input(self, shape: tuple, classes: int) -> str:
        """An integer label input, shared with an earlier head of the same shape now and then."""
        for name, spec in self.inputs.items():
            if name in self.labels and tuple(spec["shape"]) == shape and self.chance(0.5):
                self.labels[name] = min(self.labels[name], classes)
                return name
        name = self.add_input("label", shape, self.rng.choice(["int64", "int64", "int32"]))
        self.labels[name] = classes
        return name

    def float_input(self, shape: tuple, unit: bool) -> str:
        name = self.add_input("target", shape, self.dtype)
        if unit:
            self.unit_inputs.append(name)
        return name

    def loss_phase(self):
        return self.phase_list([["train"], ["train"], ["train"], ["train", "test"]])

    def classify_head(self, x: str) -> None:
        """Logits of K >= 2 classes over axis 1 ([N, K] or per pixel [N, K, H, W]) or axis 2 of a
        rank-3 blob; SoftmaxWithLoss in train, Accuracy in test, Softmax for infer."""
        b = self.blobs[x]
        k = self.rng.randint(2, 6)
        axis = 1
        if b.rank == 4 and self.chance(0.3):
            logits = self.conv(x, k, same_size=self.chance(0.5), allow_share=False)
            label_shape = ("N",) + self.blobs[logits].shape[2:]
        elif b.rank == 3 and self.chance(0.6):
            logits = self.inner_product(x, k, axis=2, allow_share=False)
            axis = self.rng.choice([2, -1])
            label_shape = ("N", b.shape[1])
        else:
            logits = self.inner_product(x, k, allow_share=False)
            label_shape = ("N",)
        label = self.label_input(label_shape, k)
        params: dict = {} if axis == 1 else {"axis": axis}
        phase = self.loss_phase()
        if phase == "train" and self.chance(0.25):
            # an ignored class (train only: the batch there has several labels, not all ignored)
            params["ignore_label"] = self.rng.randrange(k)
        if self.chance(0.2):
            params["loss_weight"] = self.rng.choice([0.5, 2.0])
        self.add("SoftmaxWithLoss", [logits, label], self.fresh("loss"), "loss", phase=phase, **params)
        acc: dict = {"phase": self.phase_list([["test"], ["test"], ["train", "test"]])}
        if axis != 1:
            acc["axis"] = axis
        if k > 2 and self.chance(0.3):
            acc["top_k"] = 2
        self.add("Accuracy", [logits, label], self.fresh("accuracy"), "accuracy", **acc)
        prob = self.softmax(logits, axis, log=self.chance(0.2), phase="infer", prefix="prob")
        self.outputs.append(prob)

    def regress_head(self, x: str) -> None:
        """EuclideanLoss against a float target input; the prediction is the infer output."""
        b = self.blobs[x]
        pred = x if b.rank == 2 and x not in self.inputs and self.chance(0.3) else \
            self.inner_product(x, self.rng.randint(1, 5), allow_share=False)
        target = self.float_input(self.blobs[pred].shape, unit=False)
        pair = [pred, target] if self.chance(0.7) else [target, pred]
        self.add("EuclideanLoss", pair, self.fresh("loss"), "loss", phase=self.loss_phase(),
                 loss_weight=self.rng.choice([None, None, 0.5]))
        self.outputs.append(pred)

    def sigmoid_head(self, x: str) -> None:
        """SigmoidCrossEntropyLoss against probabilities (a float input) or 0/1 integers."""
        logits = self.inner_product(x, self.rng.randint(1, 5), allow_share=False)
        shape = self.blobs[logits].shape
        if self.chance(0.3):
            target = self.label_input(shape, 2)
        else:
            target = self.float_input(shape, unit=True)
        self.add("SigmoidCrossEntropyLoss", [logits, target], self.fresh("loss"), "loss",
                 phase=self.loss_phase())
        prob = self.fresh("prob")
        self.add("Sigmoid", logits, prob, "sigmoid", phase="infer")
        self.set_blob(prob, shape, 0.0, 1.0)
        self.outputs.append(prob)

    def aux_loss(self) -> None:
        """A second, weighted loss between two same-shaped blobs of the trunk."""
        by_shape: dict[tuple, list[str]] = {}
        for name, blob in self.blobs.items():
            if name not in self.inputs:
                by_shape.setdefault(blob.shape, []).append(name)
        pairs = [names for names in by_shape.values() if len(names) >= 2]
        if not pairs:
            return
        a, b = self.rng.sample(self.rng.choice(pairs), 2)
        self.add("EuclideanLoss", [a, b], self.fresh("loss"), "loss", phase="train",
                 loss_weight=self.rng.choice([0.1, 0.5]))

    # -- the whole net ---------------------------------------------------------------------------
    def build(self) -> GeneratedNet:
        rng = self.rng
        if self.chance(0.7):
            shape = ("N", rng.randint(1, MAX_CHANNELS), rng.randint(4, 9), rng.randint(4, 9))
        else:
            shape = ("N", rng.randint(2, 12))
        x = self.set_blob(self.add_input("data", shape, self.dtype), shape)
        for _ in range(rng.randint(2, 7)):
            x = self.block(x)
        self.trunk_end = x
        trunk = dict(self.blobs)
        heads = [self.classify_head, self.regress_head, self.sigmoid_head]
        for head in rng.sample(heads, rng.choice([1, 1, 2])):
            head(x)
        if self.chance(0.25):
            self.blobs = {k: v for k, v in self.blobs.items() if k in trunk}
            self.aux_loss()
        return GeneratedNet(self.seed, self.text(), self.dtype, dict(self.labels), list(self.unit_inputs),
                            {layer["type"] for layer in self.layers})

    def text(self) -> str:
        lines = [f"name: diff{self.seed}", "inputs:"]
        for name, spec in self.inputs.items():
            lines.append(f"  {name}: {_flow(spec)}")
        lines.append("layers:")
        lines += [f"  - {_flow(layer)}" for layer in self.layers]
        if self.chance(0.5) or self.list_outputs:
            outputs = list(self.outputs)
            if self.chance(0.3):
                # a trunk blob as an extra output (it may also feed the heads)
                outputs.append(self.trunk_end)
            lines.append(f"outputs: {_flow(list(dict.fromkeys(outputs)))}")
        return "\n".join(lines) + "\n"


def _flow(value) -> str:
    """One line of YAML flow style, as the examples in docs/spec.md are written."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
