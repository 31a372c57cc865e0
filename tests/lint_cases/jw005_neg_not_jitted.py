# expect: -
def f(x):
    for i in range(10000):
        x = x * 0.99
    return x
