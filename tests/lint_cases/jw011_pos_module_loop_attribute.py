# expect: JW011@15
import jax
import numpy as np

update = jax.jit(lambda params, grads: params - 0.1 * grads, donate_argnums=0)


class Log:
    last = None


log, params = Log(), np.ones(3, np.float32)
for grads in [np.ones(3, np.float32)] * 3:
    params = update(params, grads)
    log.last = np.asarray(params)
