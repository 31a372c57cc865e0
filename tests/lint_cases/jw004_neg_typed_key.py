# expect: -
import jax

key = jax.random.key(0)
