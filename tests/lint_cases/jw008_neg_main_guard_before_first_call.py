# expect: -
import jax

SCALE = 1.0

@jax.jit
def scaled(x):
    return x * SCALE

def main():
    print(scaled(2.0))

if __name__ == "__main__":
    SCALE = 3.0  # set from the command line, before anything is traced
    main()
