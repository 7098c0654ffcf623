/** Jest for the data layer (no JupyterLab, no DOM): ts-jest compiles src to CommonJS. */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/src'],
  testMatch: ['**/__tests__/**/*.test.ts'],
  transform: {
    '^.+\\.ts$': [
      'ts-jest',
      {
        tsconfig: {
          module: 'commonjs',
          target: 'ES2020',
          lib: ['DOM', 'ES2020'],
          strict: true,
          esModuleInterop: true,
          types: ['jest', 'node'],
          isolatedModules: true
        }
      }
    ]
  }
};
