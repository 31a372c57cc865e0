# expect: JW004@4
import jax

key = jax.random.PRNGKey(0)
