"""Returns and advantages for an RL rollout with time limits: truncation is not termination.

A rollout of 3 episodes where the 2nd is cut by a time limit (the agent did not fail: the
environment was reset). Treating the cut as a termination makes its last return too small;
`discounted_returns` and `gae` bootstrap from the value of the true next state instead.
Checked against a plain float64 NumPy loop.
"""

import jax.numpy as jnp
import numpy as np

from jaxwise.sequence import discounted_returns, gae

gamma, lam = 0.9, 0.95
rewards = np.array([1, 1, 1, 1, 1, 1, 1, 1], np.float32)
dones = np.array([0, 0, 1, 0, 0, 0, 0, 0], np.float32)  # episode 1 fails at t = 2
truncated = np.array([0, 0, 0, 0, 1, 0, 0, 0], np.float32)  # episode 2 hits the limit at t = 4
values = np.array([2, 2, 1, 3, 5, 2, 2, 2, 4], np.float32)  # V(s_0) … V(s_8)
next_values = np.append(values[1:], 0).astype(np.float32)[:8]
next_values[4] = 6.0  # V of the true state after the cut

wrong = discounted_returns(jnp.asarray(rewards), jnp.asarray(np.maximum(dones, truncated)), gamma)
right = discounted_returns(
    jnp.asarray(rewards),
    jnp.asarray(dones),
    gamma,
    truncated=jnp.asarray(truncated),
    next_values=jnp.asarray(next_values),
)
print(f"return at the cut, treated as terminal: {float(wrong[4]):.2f}")
print(f"return at the cut, bootstrapped:        {float(right[4]):.2f}")

# float64 reference loop (the last step bootstraps from V(s_8) = next_values[7])
ref = np.zeros(8)
future = float(next_values[-1])
for t in reversed(range(8)):
    if truncated[t]:
        future = rewards[t] + gamma * next_values[t]
    else:
        future = rewards[t] + gamma * (1 - dones[t]) * future
    ref[t] = future
np.testing.assert_allclose(np.asarray(right), ref, rtol=1e-6)

adv = gae(
    jnp.asarray(rewards),
    jnp.asarray(dones),
    jnp.asarray(values),
    gamma,
    lam,
    truncated=jnp.asarray(truncated),
    next_values=jnp.asarray(next_values),
)
ref_adv = np.zeros(8)
running = 0.0
for t in reversed(range(8)):
    following = next_values[t] if truncated[t] else values[t + 1]
    delta = rewards[t] + gamma * (1 - dones[t]) * following - values[t]
    running = delta + (0.0 if truncated[t] else gamma * lam * (1 - dones[t]) * running)
    ref_adv[t] = running
np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-5, atol=1e-6)
print("GAE advantages:", [round(float(a), 3) for a in adv])
print("returns and advantages equal the float64 reference loop")
