"""Training: an MLP built with the Symbol API learns scikit-learn's digits, one compiled call per step.

    python tutorials/05_training.py          # 30 epochs, 128 hidden units
    python tutorials/05_training.py --quick  # 3 epochs (what CI runs)

The Symbol graph computes a scalar loss. The Gradient pass (``relay_passes.gradient``)
walks it backwards and adds, for every op, the nodes of its registered gradient; the
optimizer's update ops follow. The result is ONE Relax function,
``train_step(params..., optimizer state..., data, label) -> (loss, new params..., new state...)``,
that the pipeline fuses and compiles like any model. ``Trainer`` keeps the parameters and
the optimizer state as TVM tensors between calls. The digits (8x8 images, 1797 of them)
ship inside scikit-learn: nothing is downloaded.
"""
import argparse
import os
import time

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import tvm_ext.symbol as sym  # noqa: E402
from tvm_ext.training import Adam, Trainer  # noqa: E402

CLASSES = 10


def mlp(hidden: int):
    """Logits of a 2-layer MLP, and its mean softmax cross-entropy against one-hot labels."""
    data, label = sym.Variable("data"), sym.Variable("label")
    fc1 = sym.FullyConnected(data, num_hidden=hidden, name="fc1")  # fc1_weight/bias shapes inferred
    logits = sym.FullyConnected(sym.relu(fc1), num_hidden=CLASSES, name="fc2")
    loss = -sym.mean(sym.sum(sym.log_softmax(logits, axis=-1) * label, axis=[1]))
    return loss, logits


def main(quick: bool) -> None:
    epochs, hidden, batch = (3, 64, 64) if quick else (30, 128, 64)
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                                        stratify=digits.target)
    onehot = np.eye(CLASSES, dtype="float32")
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of {x.shape[1]} pixels")

    # 1. The model, and the compiled training step built from it.
    loss, logits = mlp(hidden)
    t0 = time.perf_counter()
    trainer = Trainer(loss, ["data", "label"], Adam(lr=0.01), shapes={"data": (batch, x.shape[1]),
                      "label": (batch, CLASSES)}, predict=logits, predict_shapes={"data": x_test.shape})
    print(f"compiled the train step and the predictor in {time.perf_counter() - t0:.1f} s")
    step = trainer.train_module["main"]
    print(f"train_step: {len(step.params)} inputs ({', '.join(p.name for p in step.params)})")
    print(trainer.compiled[0].report())

    # 2. Train: every step is one call of the compiled function.
    rng = np.random.default_rng(0)
    losses = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        order = rng.permutation(len(x_train))
        batch_losses = [trainer.step(x_train[idx], onehot[y_train[idx]])
                        for idx in (order[i:i + batch] for i in range(0, len(order) - batch + 1, batch))]
        losses.append(float(np.mean(batch_losses)))
        accuracy = float((trainer.predict(x_test).argmax(1) == y_test).mean())
        print(f"epoch {epoch + 1:2d}  loss {losses[-1]:.4f}  test accuracy {accuracy:.3f}  "
              f"({len(batch_losses)} steps, {time.perf_counter() - t0:.2f} s)")

    # 3. Check: the loss fell; the full run also reaches 95% test accuracy.
    assert losses[-1] < losses[0], f"loss did not fall: {losses}"
    if not quick:
        assert accuracy >= 0.95, f"test accuracy {accuracy:.3f} < 0.95"
    print(f"OK: loss {losses[0]:.4f} -> {losses[-1]:.4f}, test accuracy {accuracy:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 epochs, a smaller hidden layer")
    main(parser.parse_args().quick)
