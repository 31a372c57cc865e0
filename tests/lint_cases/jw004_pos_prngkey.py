# expect: JW004
import jax

key = jax.random.PRNGKey(0)
